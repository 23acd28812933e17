"""The runtime's event reports through Quor's ASGI application: progress of the running
turn is stored before Django's request cycle, everything else gets the view's answer."""

import asyncio
import json
import threading
import time

import pytest
from channels.testing import ApplicationCommunicator, HttpCommunicator
from django.db import connection

from quor.asgi import application
from quor.lib.kept_connections import THREADS
from sandboxes.api import ingest, views
from sandboxes.models import Sandbox, Session, hash_token
from sandboxes.sessions.events import session_events_append, session_progress_append
from tests import factories
from tests.sandboxes.test_event_stream import connect, cookie_for
from tests.scenarios import CONNECT_TIMEOUT_S, run_scenario

pytestmark = pytest.mark.django_db(transaction=True)
CREDENTIAL = "runtime-credential"
DELTA = {"kind": "assistant_text_delta", "payload": {"text": "Hel"}}


@pytest.fixture
def running(owner):
    """A running session of a sandbox with CREDENTIAL, and the seq of its turn."""
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    Sandbox.objects.filter(pk=session.sandbox_id).update(
        runtime_credential_hash=hash_token(CREDENTIAL)
    )
    [started] = session_events_append(session=session, events=[("session_started", {})])
    return session, started.seq


@pytest.fixture
def view_calls(monkeypatch):
    """The reports Django's view answered."""
    calls = []
    answer = views.RuntimeSessionEventsView.post

    def counted(self, request, session_id):
        calls.append(session_id)
        return answer(self, request, session_id)

    monkeypatch.setattr(views.RuntimeSessionEventsView, "post", counted)
    return calls


async def post_report(session_id, body, credential=CREDENTIAL):
    body = json.dumps(body).encode() if not isinstance(body, bytes) else body
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"host", b"127.0.0.1"),
    ]
    if credential:
        headers.append((b"authorization", f"Bearer {credential}".encode()))
    communicator = HttpCommunicator(
        application, "POST", f"/api/v1/runtime/sessions/{session_id}/events/", body, headers
    )
    response = await communicator.get_response(timeout=10)
    return response["status"], json.loads(response["body"] or b"null")


def report(session_id, body, credential=CREDENTIAL):
    return run_scenario(post_report, session_id, body, credential)


def seqs(session):
    return list(session.events.order_by("seq").values_list("seq", "kind"))


def test_progress_of_the_running_turn_is_stored_and_reaches_viewers_without_the_view(
    running, owner, view_calls
):
    session, turn = running
    cookie = cookie_for(owner)

    async def scenario():
        viewer = connect(session, cookie, after=turn)
        assert (await viewer.connect(CONNECT_TIMEOUT_S))[0]
        answer = await post_report(session.pk, {"events": [DELTA, DELTA], "turn": turn})
        received = [await viewer.receive_json_from(timeout=5) for _ in range(2)]
        await viewer.disconnect()
        return answer, received

    answer, received = run_scenario(scenario)
    assert answer == (200, {"last_seq": turn + 2})
    assert [(e["seq"], e["kind"], e["payload"]) for e in received] == [
        (turn + 1, "assistant_text_delta", {"text": "Hel"}),
        (turn + 2, "assistant_text_delta", {"text": "Hel"}),
    ]
    stored = session.events.get(seq=turn + 1)
    assert received[0]["created_at"] == stored.created_at.isoformat()
    session.refresh_from_db()
    assert session.agent_seen_at is not None
    assert view_calls == []


def test_an_outcome_or_a_report_without_its_turn_is_stored_by_the_view(running, view_calls):
    session, turn = running
    finished = {"events": [DELTA, {"kind": "turn_finished", "payload": {}}], "turn": turn}
    assert report(session.pk, finished) == (200, {"last_seq": turn + 2})
    session.refresh_from_db()
    assert session.status == Session.Status.WAITING
    Session.objects.filter(pk=session.pk).update(status=Session.Status.RUNNING)
    assert report(session.pk, {"events": [DELTA]}) == (200, {"last_seq": turn + 3})
    assert len(view_calls) == 2


@pytest.mark.parametrize(
    ("change", "body", "status", "code"),
    [
        ("nothing", {"events": [DELTA], "turn": 999}, 409, "sessions.turn_ended"),
        ("cancelled", None, 409, "sessions.cancelled"),
        ("another credential", None, 401, "authentication_failed"),
        ("no credential", None, 401, "not_authenticated"),
        ("owner deactivated", None, 401, "authentication_failed"),
        ("nothing", {"events": [{"kind": "rm -rf", "payload": {}}], "turn": 1}, 400, None),
        ("nothing", {"events": [], "turn": 1}, 400, None),
        ("nothing", {"events": [DELTA], "turn": "1", "extra": 1}, 400, None),
        ("nothing", b"{not json", 400, None),
        (
            "nothing",
            b'{"events": [{"kind": "tool_call", "payload": {"x": NaN}}], "turn": 1}',
            400,
            None,
        ),
        ("nothing", {"events": [{"kind": ["tool_call"], "payload": {}}], "turn": 1}, 400, None),
        ("nothing", '{"events": [], "turn": 1}'.encode("utf-16"), 400, None),
    ],
)
def test_a_report_it_does_not_store_gets_the_views_answer_and_changes_nothing(
    running, owner, view_calls, change, body, status, code
):
    session, turn = running
    if change == "cancelled":
        Session.objects.filter(pk=session.pk).update(status=Session.Status.CANCELLED)
    if change == "owner deactivated":
        type(owner).objects.filter(pk=owner.pk).update(is_active=False)
    credential = {"another credential": "forged", "no credential": ""}.get(change, CREDENTIAL)
    answered, error = report(
        session.pk, body or {"events": [DELTA], "turn": turn}, credential=credential
    )
    assert answered == status
    if code:
        assert error["error"]["code"] == code
    assert seqs(session) == [(turn, "session_started")]
    assert len(view_calls) == (0 if status == 401 else 1)  # a 401 comes before the view


@pytest.mark.usefixtures("running")
def test_another_sandboxs_session_is_not_found(colleague, view_calls):
    foreign = factories.make_session(colleague, status=Session.Status.RUNNING)
    [foreign_turn] = session_events_append(session=foreign, events=[("session_started", {})])
    answered, error = report(foreign.pk, {"events": [DELTA], "turn": foreign_turn.seq})
    assert (answered, error["error"]["code"]) == (404, "not_found")
    assert seqs(foreign) == [(foreign_turn.seq, "session_started")]


def test_a_body_over_the_limit_is_refused_by_django(running, settings):
    session, turn = running
    settings.QUOR_MAX_REQUEST_BYTES = 100
    text = {"kind": "assistant_text_delta", "payload": {"text": "x" * 200}}
    answered, error = report(session.pk, {"events": [text], "turn": turn})
    assert (answered, error["error"]["code"]) == (413, "request_too_large")
    assert seqs(session) == [(turn, "session_started")]


@pytest.mark.parametrize(("limit", "status"), [(10_000, 200), (100, 413)])
def test_a_body_in_several_parts_is_read_whole_or_refused_past_the_limit(
    running, settings, view_calls, limit, status
):
    """As daphne hands over a large body: in parts, each saying whether more follows."""
    session, turn = running
    settings.QUOR_MAX_REQUEST_BYTES = limit
    body = json.dumps({"events": [DELTA] * 20, "turn": turn}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"authorization", f"Bearer {CREDENTIAL}".encode()),
        (b"host", b"127.0.0.1"),
    ]
    path = f"/api/v1/runtime/sessions/{session.pk}/events/"

    async def scenario():
        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                 "headers": headers, "http_version": "1.1", "scheme": "http",
                 "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000)}  # fmt: skip
        communicator = ApplicationCommunicator(application, scope)
        for start in range(0, len(body), 150):
            part = body[start : start + 150]
            more = start + 150 < len(body)
            await communicator.send_input({"type": "http.request", "body": part, "more_body": more})
        started = await communicator.receive_output(timeout=10)
        await communicator.receive_output(timeout=10)
        return started["status"]

    assert run_scenario(scenario) == status
    assert session.events.count() == (21 if status == 200 else 1)
    assert view_calls == []  # stored without it, or refused by the middleware before it


def test_reports_stored_by_both_ways_at_once_get_consecutive_seqs(running):
    session, turn = running
    errors = []

    def by_the_view():
        for _ in range(15):
            session_events_append(session=session, events=[("assistant_text", {"text": "v"})])
        connection.close()

    def in_two_statements():
        try:
            for _ in range(15):
                stored = session_progress_append(
                    session_id=session.pk,
                    credential_hash=hash_token(CREDENTIAL),
                    turn=turn,
                    events=[("assistant_text_delta", {"text": "a"}), ("tool_call", {})],
                )
                assert stored is not None
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=t) for t in (by_the_view, in_two_statements) * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [seq for seq, _ in seqs(session)] == list(range(1, 2 + 15 * 2 + 15 * 4))


def test_the_stored_events_read_back_as_they_were_sent(running, view_calls):
    session, turn = running
    payload = {"text": "naïve ✓", "nested": {"list": [1, 2.5, None, True]}}
    assert (
        report(session.pk, {"events": [{"kind": "tool_result", "payload": payload}], "turn": turn})[
            0
        ]
        == 200
    )
    event = session.events.get(seq=turn + 1)
    assert (event.kind, event.payload) == ("tool_result", payload)
    assert view_calls == []


def test_kept_connections_that_died_are_replaced_before_the_next_reports(running, view_calls):
    session, turn = running
    body = {"events": [DELTA], "turn": turn}

    async def at_once(count):
        """As many reports at once as there are threads, so that each thread has one."""
        return await asyncio.gather(*(post_report(session.pk, body) for _ in range(count)))

    assert [status for status, _ in run_scenario(at_once, THREADS)] == [200] * THREADS
    with connection.cursor() as cursor:  # as a restart of PostgreSQL would
        # Clients only: an autovacuum worker on the database may not be terminated.
        others = (
            "datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        )
        # Waits for the ends of these connections only: a process of the run that is
        # connected to this database too (a worker's web tier, its beat) connects again.
        cursor.execute(f"SELECT array_agg(pid) FROM pg_stat_activity WHERE {others}")  # noqa: S608
        ended = cursor.fetchone()[0]
        assert ended, "the reports kept no connection to end"
        cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [ended])
        deadline = time.monotonic() + 10
        alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s::int[])"
        while cursor.execute(alive, [ended]).fetchone()[0]:
            assert time.monotonic() < deadline, "the connections did not end"
            time.sleep(0.05)
    assert [status for status, _ in run_scenario(at_once, THREADS * 2)] == [200] * THREADS * 2
    assert view_calls == []
    assert [seq for seq, _ in seqs(session)] == list(range(1, turn + 1 + THREADS * 3))


def test_a_report_stored_while_the_channel_layer_is_down_is_answered_and_stored_once(
    running, monkeypatch, view_calls
):
    """The runtime must not send it again: viewers read it from the database."""
    session, turn = running

    async def unreachable(*args):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(ingest, "session_events_publish", unreachable)
    assert report(session.pk, {"events": [DELTA], "turn": turn}) == (200, {"last_seq": turn + 1})
    assert seqs(session) == [(turn, "session_started"), (turn + 1, "assistant_text_delta")]
    assert view_calls == []


@pytest.mark.parametrize(
    "spelling", [lambda pk: f"urn:uuid:{pk}", lambda pk: str(pk).upper()], ids=["urn", "upper"]
)
def test_another_spelling_of_the_session_id_is_left_to_the_view(running, view_calls, spelling):
    """Viewers follow the session's canonical id: the view stores and publishes under it."""
    session, turn = running
    assert report(spelling(session.pk), {"events": [DELTA], "turn": turn})[0] == 200
    assert len(view_calls) == 1
    assert seqs(session) == [(turn, "session_started"), (turn + 1, "assistant_text_delta")]


def test_a_repeated_authorization_header_or_a_large_report_goes_to_the_view(running, view_calls):
    session, turn = running
    body = json.dumps({"events": [DELTA], "turn": turn}).encode()

    async def twice_authorized():
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"authorization", b"Bearer forged"),
            (b"authorization", f"Bearer {CREDENTIAL}".encode()),
            (b"host", b"127.0.0.1"),
        ]
        communicator = HttpCommunicator(
            application, "POST", f"/api/v1/runtime/sessions/{session.pk}/events/", body, headers
        )
        return (await communicator.get_response(timeout=10))["status"]

    assert run_scenario(twice_authorized) == 401
    large = {"kind": "tool_result", "payload": {"output": "x" * 300_000}}
    assert report(session.pk, {"events": [large], "turn": turn}) == (200, {"last_seq": turn + 1})
    assert len(view_calls) == 1  # the large one; the view refused the other before its post
