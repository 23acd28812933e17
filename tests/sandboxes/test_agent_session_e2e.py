"""A whole session end to end: the API, a real Celery worker, the agent runtime in a
real sandbox, the real egress proxy, a scripted model provider (HTTPS, on loopback),
events over the WebSocket, files, a follow-up and a cancel."""

import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from quor.models import ModelProvider
from sandboxes.models import Session
from sandboxes.runtime import services
from tests import factories
from tests.environment import PORTS
from tests.sandboxes.test_event_stream import connect, cookie_for
from tests.scenarios import CONNECT_TIMEOUT_S, run_scenario

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

MODEL_KEY = "sk-ant-e2e-model-key-0123456789abcdef"
PROGRAM = (
    "numbers = [int(x) for x in open('attachments/numbers.txt').read().split()]\n"
    "open('result.txt', 'w').write(str(sum(numbers)))\n"
    "print('the sum is', sum(numbers))\n"
)
SCRIPT = [
    {
        "text": "Let me read the attachment.",
        "tool_calls": [{"name": "read_file", "input": {"path": "attachments/numbers.txt"}}],
    },
    {
        "text": "Now a program.",
        "tool_calls": [{"name": "write_file", "input": {"path": "sum.py", "content": PROGRAM}}],
    },
    {"tool_calls": [{"name": "run_command", "input": {"command": "python3 sum.py"}}]},
    {"text": "The **sum is 60**; it is in `result.txt`."},
    {"text": "Yes: the sum I computed was 60."},
    {
        "text": "Waiting a minute.",
        "tool_calls": [{"name": "run_command", "input": {"command": "sleep 60"}}],
    },
]


@pytest.fixture
def model_id(org, upstream_fakes):
    provider = factories.make_provider(
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url=f"https://model.test:{PORTS.MODEL}",
        api_key=MODEL_KEY, model_names=["scripted"],
    )  # fmt: skip
    upstream_fakes.model.script = SCRIPT
    upstream_fakes.model.requests.clear()
    return f"{provider.pk}:scripted"


def collect_until(cookie, session, after, predicate, timeout=120):
    """Events over the WebSocket after `after`, until one satisfies `predicate`."""

    async def scenario():
        communicator = connect(session, cookie, after=after)
        connected, _ = await communicator.connect(CONNECT_TIMEOUT_S)
        assert connected
        events, deadline = [], time.monotonic() + timeout
        while not events or not predicate(events[-1]):
            assert time.monotonic() < deadline, [e["kind"] for e in events]
            events.append(await communicator.receive_json_from(timeout=timeout))
        await communicator.disconnect()
        return events

    return run_scenario(scenario)


def test_a_session_from_prompt_to_files_follow_up_and_cancel(
    client_for, owner, model_id, egress_proxy, celery_worker, clean_runtimes, upstream_fakes
):
    api = client_for(owner)
    cookie = cookie_for(owner)
    attachment = SimpleUploadedFile("numbers.txt", b"10 20 30\n")
    response = api.post(
        "/api/v1/sessions/",
        {
            "prompt": "Add up the numbers in the attachment.",
            "model": model_id,
            "attachments": [attachment],
        },
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    session = Session.objects.get(pk=response.json()["id"])

    events = collect_until(cookie, session, 0, lambda e: e["kind"] in ("turn_finished", "error"))
    kinds = [e["kind"] for e in events if e["kind"] != "assistant_text_delta"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert kinds == [
        "user_message",
        "session_started",
        "assistant_text",
        "tool_call",
        "tool_result",
        "assistant_text",
        "tool_call",
        "file_changed",
        "tool_result",
        "tool_call",
        "tool_result",
        "assistant_text",
        "turn_finished",
    ], kinds
    results = [e["payload"] for e in events if e["kind"] == "tool_result"]
    assert "10 20 30" in results[0]["output"]
    assert "the sum is 60" in results[2]["output"]
    assert events[-1]["payload"]["usage"]["output_tokens"] > 0
    assert {r["headers"]["x-api-key"] for r in upstream_fakes.model.requests} == {MODEL_KEY}

    download = api.get(f"/api/v1/sessions/{session.pk}/files/content", {"path": "result.txt"})
    assert b"".join(download.streaming_content) == b"60"
    session.refresh_from_db()
    assert session.status == Session.Status.WAITING

    last = events[-1]["seq"]
    assert (
        api.post(
            f"/api/v1/sessions/{session.pk}/messages/", {"text": "Still there?"}, format="json"
        ).status_code
        == 202
    )
    events = collect_until(cookie, session, last, lambda e: e["kind"] in ("turn_finished", "error"))
    assert [e["payload"]["text"] for e in events if e["kind"] == "assistant_text"] == [
        "Yes: the sum I computed was 60."
    ]
    follow_up_request = upstream_fakes.model.requests[-1]["body"]
    assert len([m for m in follow_up_request["messages"] if m["role"] == "assistant"]) == 4

    last = events[-1]["seq"]
    assert (
        api.post(
            f"/api/v1/sessions/{session.pk}/messages/", {"text": "Now wait."}, format="json"
        ).status_code
        == 202
    )
    collect_until(cookie, session, last, lambda e: e["kind"] == "tool_call")
    time.sleep(0.5)
    started = time.monotonic()
    cancelled = api.post(f"/api/v1/sessions/{session.pk}/cancel/")
    assert cancelled.status_code == 200, (
        cancelled.json(),
        list(session.events.values_list("kind", flat=True)),
    )
    assert cancelled.json()["status"] == "cancelled"
    deadline = time.monotonic() + 2
    while services.sandbox_exec(user=owner, argv=["pgrep", "-f", "^sleep 60"]).exit_code == 0:
        assert time.monotonic() < deadline, "the agent's command still runs"
        time.sleep(0.2)
    assert time.monotonic() - started < 3
    assert session.events.filter(kind="cancelled").exists()
