"""The session page's live stream in a real browser: tool calls as cards written for
people, the agent's Markdown rendered safely, errors in words for people, the working
state, and follow-ups and stops without a page reload.

Most tests build the session's events with the factories: the page replays them over its
WebSocket, so no sandbox is needed. One test runs a real turn end to end."""

import uuid

import pytest
import redis
from django.conf import settings
from playwright.sync_api import expect

from approvals import services as approvals
from quor.models import ModelProvider
from sandboxes.models import Session
from sandboxes.sessions import services as sessions
from tests import factories
from tests.environment import PORTS
from tests.ui.conftest import assert_accessible, assert_fits_the_width

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROGRAM = 'print("hello")\n' * 7  # 105 bytes
OUTPUT = "".join(f"line {n}\n" for n in range(1, 11)) + "[exit code: 3]"
MARKDOWN = (
    "Here is **the plan**:\n\n"
    '<img src="x" onerror="window.injected = true">\n\n'
    "```python\nimport os\nprint(os.getcwd())\n```\n\n"
    "See [the docs](https://example.com/docs), not [this](javascript:window.injected=1)."
)
AGENT_FACING = "The user rejected it. It was not sent; do not retry it, ask the user."


@pytest.fixture
def owner():
    return factories.make_user(email="owner@acme.test")


def replayed_session(owner, status, events):
    session = factories.make_session(owner, status=status)
    for seq, (kind, payload) in enumerate(events, start=1):
        factories.make_event(session, seq, kind, **payload)
    return session


def tool(call_id, name, **tool_input):
    return {"id": call_id, "name": name, "input": tool_input}


def result(call_id, name, output, *, is_error=False):
    return {"id": call_id, "name": name, "output": output, "is_error": is_error}


def a_turn(*rest):
    return [
        ("user_message", {"text": "Write a program and run it."}),
        ("session_started", {}),
        ("assistant_text", {"text": MARKDOWN}),
        ("tool_call", tool("c1", "write_file", path="hello.py", content=PROGRAM)),
        ("file_changed", {"path": "hello.py"}),
        ("tool_result", result("c1", "write_file", "Wrote 105 bytes to hello.py.")),
        ("tool_call", tool("c2", "run_command", command="python3 hello.py")),
        ("tool_result", result("c2", "run_command", OUTPUT, is_error=True)),
        *rest,
    ]


def test_a_turn_reads_as_cards_markdown_and_an_error_for_people(ui, owner):
    session = replayed_session(
        owner,
        Session.Status.FAILED,
        a_turn(("error", {"code": "model.unauthorized", "message": AGENT_FACING})),
    )
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    stream = page.locator("#events")
    stream.locator(".stream-error").wait_for()

    # One card per tool call, in words: what was done, the file it opens, the exit code.
    created, ran = page.locator(".tool").all()
    assert created.locator(".tool-title").inner_text() == "Created hello.py · 105 B"
    link = created.locator("a.file-link")
    assert link.get_attribute("href") == (
        f"/api/v1/sessions/{session.pk}/files/content?path=hello.py"
    )
    page.evaluate(
        """() => document.addEventListener("quor:open-file", (e) => {
             window.opened = e.detail.path; e.preventDefault(); })"""
    )
    link.click()
    assert page.evaluate("window.opened") == "hello.py"
    assert ran.locator(".tool-title").inner_text() == "Ran python3 hello.py"
    assert ran.locator(".tool-badge").inner_text() == "Exit code 3"
    preview = ran.locator(".tool-preview")
    assert preview.inner_text().splitlines() == [f"line {n}" for n in range(1, 7)]
    assert not ran.get_by_text("line 10").is_visible()
    ran.get_by_text("Show all 10 lines").click()
    assert ran.locator(".tool-full").inner_text().splitlines()[-1] == "line 10"
    assert not preview.is_visible()

    # Markdown with highlighted code; the model's HTML is text, links open outside.
    message = stream.locator(".message.assistant .markdown")
    assert message.locator("strong").inner_text() == "the plan"
    assert message.locator("img").count() == 0
    assert '<img src="x"' in message.inner_text()
    assert message.locator("pre code .hljs-keyword").first.inner_text() == "import"
    [docs] = message.locator("a").all()
    assert docs.get_attribute("href") == "https://example.com/docs"
    assert docs.get_attribute("target") == "_blank"
    assert set(docs.get_attribute("rel").split()) >= {"noopener", "noreferrer"}
    assert page.evaluate("window.injected") is None

    # The error in words for people; the agent's text only behind "Technical details".
    error = stream.locator(".stream-error")
    assert "model provider refused" in error.locator(".stream-error-text").inner_text()
    assert not error.get_by_text(AGENT_FACING).is_visible()
    error.get_by_text("Technical details").click()
    assert error.get_by_text(AGENT_FACING).is_visible()
    assert page.locator("#status").inner_text() == "Failed"
    assert page.locator("#working").is_hidden()
    # Screen readers are not told each piece: the stream itself is no live region.
    assert stream.get_attribute("aria-live") is None

    assert_fits_the_width(page)
    assert_accessible(page)
    ui.screenshot(page, "session-stream")


@pytest.fixture
def no_turn_left_queued():
    """The follow-up's turn is queued for a worker this test has not: drop it, so no
    later test's worker runs it."""
    yield
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete("agents")
    client.close()


def test_follow_ups_and_stops_happen_in_place(ui, owner, no_turn_left_queued):
    session = replayed_session(
        owner,
        Session.Status.WAITING,
        a_turn(("turn_finished", {"stop_reason": "end_turn", "usage": {"input_tokens": 1200}})),
    )
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    page.locator("#events .note", has_text="Done").wait_for()
    assert page.locator("#status").inner_text() == "Done"
    assert page.locator("#working").is_hidden()
    url = page.url
    page.evaluate("window.stillHere = true")
    assert "Enter to send" in page.locator("#composer-hint").inner_text()

    composer = page.locator("#text")
    composer.fill("Now make it say goodbye.")
    composer.press("Control+Enter")
    mine = page.locator(".message.user").last
    mine.get_by_text("Now make it say goodbye.").wait_for()
    # The working state shows at once, without reload, until the agent is done.
    assert page.locator("#working").is_visible()
    assert page.locator("#status").inner_text() in ("Starting", "Working")
    expect(composer).to_have_value("")
    assert page.url == url and page.evaluate("window.stillHere") is True

    # A second message while the agent works is refused in place; the text stays.
    composer.fill("And then?")
    composer.press("Control+Enter")
    assert "still working" in page.locator("#composer-error").inner_text()
    assert composer.input_value() == "And then?"

    page.get_by_role("button", name="Stop").click()
    page.locator("#events .note", has_text="Stopped by you").wait_for()
    assert page.locator("#status").inner_text() == "Stopped by you"
    assert page.locator("#working").is_hidden()
    assert page.url == url and page.evaluate("window.stillHere") is True
    session.refresh_from_db()
    assert session.status == Session.Status.CANCELLED
    assert_accessible(page)


def test_the_composer_counts_checks_and_leaves_the_status_to_the_stream(
    ui, owner, no_turn_left_queued
):
    session = replayed_session(
        owner,
        Session.Status.WAITING,
        [
            ("user_message", {"text": "Hi"}),
            ("session_started", {}),
            ("assistant_text", {"text": "Hello."}),
            ("turn_finished", {"stop_reason": "end_turn"}),
        ],
    )
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    done = page.locator("#events .note", has_text="Done")
    expect(done).to_have_count(1)
    status, working = page.locator("#status"), page.locator("#working")
    send, stop = page.get_by_role("button", name="Send"), page.locator("#cancel-form")
    composer, counter = page.locator("#text"), page.locator("#text-count")
    sent = []

    def on_request(request):
        if request.url.endswith("/messages/"):
            sent.append(request.url)

    page.on("request", on_request)

    # The limit of the new-session form, counted as typed; Ctrl+Enter keeps to it.
    limit = settings.QUOR_MAX_PROMPT_CHARS
    expect(counter).to_have_text(f"0 / {limit:,} characters")
    composer.fill("a\nb")  # sent as JSON: a line break is one character, as the API counts
    expect(counter).to_have_text(f"3 / {limit:,} characters")
    composer.fill("x" * (limit + 1))
    expect(counter).to_have_text(f"This is 1 character too long: at most {limit:,}.")
    composer.press("Control+Enter")
    assert page.evaluate("() => document.querySelector('#text').validity.customError")
    page.wait_for_timeout(200)
    assert sent == [] and page.locator("#composer-error").is_hidden()
    assert_fits_the_width(page)
    assert_accessible(page)

    # Send shows the working state at once; a turn that ends before the answer to the
    # request arrives is not undone by that answer.
    held = []
    page.route("**/messages/", lambda route: held.append(route))
    composer.fill("Quick one.")
    expect(counter).to_have_text(f"10 / {limit:,} characters")
    composer.press("Control+Enter")
    expect(status).to_have_text("Starting")
    expect(working).to_be_visible()
    expect(send).to_be_disabled()
    for _ in range(50):
        if held:
            break
        page.wait_for_timeout(100)
    answer = held[0].fetch()  # the message reaches Quor; its answer waits
    assert answer.ok, answer.text()
    Session.objects.filter(pk=session.pk).update(status=Session.Status.RUNNING)
    finished = {"kind": "turn_finished", "payload": {"stop_reason": "end_turn"}}
    sessions.session_events_report(session=session, events=[finished])
    expect(done).to_have_count(2)
    held[0].fulfill(response=answer)
    expect(composer).to_have_value("")
    expect(counter).to_have_text(f"0 / {limit:,} characters")
    expect(status).to_have_text("Done")
    expect(working).to_be_hidden()
    expect(stop).to_be_hidden()
    expect(send).to_be_enabled()

    # A refused message: the status it replaced comes back, the text stays.
    page.unroute("**/messages/")
    page.route(
        "**/messages/",
        lambda route: route.fulfill(
            status=503, json={"error": {"code": "x.down", "message": "Not now."}}
        ),
    )
    composer.fill("Another.")
    composer.press("Control+Enter")
    expect(page.locator("#composer-error")).to_have_text("Not now.")
    expect(status).to_have_text("Done")
    expect(working).to_be_hidden()
    expect(send).to_be_enabled()
    expect(composer).to_have_value("Another.")


def test_file_contents_are_highlighted_when_opened_and_not_when_large(ui, owner):
    large = "x = 1\n" * 20_000  # 120 KB
    session = replayed_session(
        owner,
        Session.Status.FAILED,
        [
            ("user_message", {"text": "Write two programs."}),
            ("tool_call", tool("c1", "write_file", path="hello.py", content=PROGRAM)),
            ("tool_result", result("c1", "write_file", "Wrote 105 bytes to hello.py.")),
            ("tool_call", tool("c2", "write_file", path="large.py", content=large)),
            ("tool_result", result("c2", "write_file", "Wrote it.")),
            ("error", {"code": "sandboxes.workspace_unrestorable", "message": "Gone."}),
        ],
    )
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    error = page.locator(".stream-error-text")
    expect(error).to_contain_text("the notice at the top of this page")
    small_card, large_card = page.locator(".tool").all()
    assert page.locator(".tool-code code.hljs").count() == 0  # closed: not highlighted yet
    small_card.get_by_text("Show content").click()
    expect(small_card.locator("code.hljs .hljs-string").first).to_have_text('"hello"')
    large_card.get_by_text("Show content").click()
    expect(large_card.locator(".tool-code")).to_be_visible()
    assert large_card.locator("code.hljs").count() == 0
    assert large_card.locator(".tool-code").inner_text().startswith("x = 1")


def test_code_in_a_streamed_message_is_highlighted_once_the_message_is_complete(ui, owner):
    code = "```python\nimport os\n"
    session = replayed_session(
        owner,
        Session.Status.RUNNING,
        [
            ("user_message", {"text": "Show me some code."}),
            ("session_started", {}),
            ("assistant_text_delta", {"text": "Here:\n\n"}),
            ("assistant_text_delta", {"text": code}),
        ],
    )
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    message = page.locator(".message.assistant .markdown")
    expect(message.locator("pre code")).to_have_text("import os")
    assert message.locator("code.hljs").count() == 0  # streaming: drawn, not highlighted
    complete = {"kind": "assistant_text", "payload": {"text": "Here:\n\n" + code + "```"}}
    sessions.session_events_report(session=session, events=[complete])
    expect(message.locator("code.hljs .hljs-keyword")).to_have_text("import")


def test_an_approval_shows_what_it_sends_and_a_rejection_ends_the_turn_as_done(ui, owner, settings):
    # The tests' 8 s expiry ran out on a loaded machine before the click: the card had
    # already turned to "Expired" and taken its buttons away.
    settings.QUOR_APPROVAL_TIMEOUT_SECONDS = 600
    session = replayed_session(
        owner,
        Session.Status.RUNNING,
        [("user_message", {"text": "File an issue."}), ("session_started", {})],
    )
    app = factories.make_app(owner.membership.organization, name="FakeHub")
    session.apps.set([app])
    # Longer than the preview, with a token: the server's cut and mask are what shows.
    issue = '{"title": "Broken build", "token": "ghp_s3cret", "body": "<b>The tests fail.</b>'
    issue += "x" * 2100 + '"}'
    approvals.park_request_for_approval(
        approval_id=uuid.uuid4(),
        session_id=session.pk,
        app_id=app.pk,
        app_name=app.name,
        actions=[{"key": "issues.create", "name": "Create an issue", "policy": "ask"}],
        method="POST",
        url="https://apps.test/repos/acme/widgets/issues",
        summary="FakeHub: Create an issue (POST /repos/acme/widgets/issues)",
        body=issue.encode(),
    )
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    page.evaluate("window.stillHere = true")
    card = page.locator(".approval")
    expect(card.locator(".approval-title")).to_have_text(
        "Approval needed: FakeHub: Create an issue"
    )
    preview = card.locator(".approval-body pre").inner_text()  # as text, not markup
    assert preview == approvals.request_body_preview(issue.encode())
    assert preview.endswith(f"… ({len(issue)} bytes in all)")
    assert "<b>The tests fail.</b>" in preview and "ghp_s3cret" not in preview
    assert card.locator(".approval-body b").count() == 0
    assert page.locator("#working-text").inner_text() == "Waiting for your approval…"
    assert_accessible(page)

    card.get_by_role("button", name="Reject").click()
    expect(card.locator(".approval-outcome")).to_contain_text("Rejected by you")
    # The runtime ends the turn normally when the user rejected its request.
    sessions.session_events_report(
        session=session,
        events=[{"kind": "turn_finished", "payload": {"stop_reason": "approval_rejected"}}],
    )
    page.locator("#events .note", has_text="Rejected by you").wait_for()
    assert page.locator("#status").inner_text() == "Done"
    assert page.evaluate("window.stillHere") is True
    session.refresh_from_db()
    assert session.status == Session.Status.WAITING


HELLO = 'print("hello from the sandbox")\n'
TURN = [
    {
        "text": "I'll write a small program.",
        "tool_calls": [{"name": "write_file", "input": {"path": "hello.py", "content": HELLO}}],
    },
    {"tool_calls": [{"name": "run_command", "input": {"command": "python3 hello.py"}}]},
    {"text": "It printed `hello from the sandbox`. **Done.**"},
    {"text": "Yes, it is still there."},
]


@pytest.mark.docker
@pytest.mark.parametrize("viewport", ["desktop"])  # a real turn is slow: one width is enough
def test_a_real_turn_streams_into_cards_and_a_follow_up_continues_it(
    ui, owner, client_for, egress_proxy, celery_worker, clean_runtimes, upstream_fakes
):
    provider = factories.make_provider(
        owner.membership.organization,
        kind=ModelProvider.Kind.ANTHROPIC,
        base_url=f"https://model.test:{PORTS.MODEL}",
        api_key="sk-ant-ui-model-key-0123456789abcdef",
        model_names=["scripted"],
    )
    upstream_fakes.model.script = TURN
    created = client_for(owner).post(
        "/api/v1/sessions/",
        {"prompt": "Write a program and run it.", "model": f"{provider.pk}:scripted"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    page = ui.page_for(owner, f"/sessions/{created.json()['id']}/")
    page.evaluate("window.stillHere = true")
    expect(page.locator("#working")).to_be_visible()  # before the agent's first word

    ran = page.locator(".tool", has_text="Ran python3 hello.py")
    ran.wait_for(timeout=90_000)
    expect(ran.locator(".tool-preview")).to_have_text("hello from the sandbox")
    assert ran.locator(".tool-badge").count() == 0  # exit code 0 goes unsaid
    created_card = page.locator(".tool").first
    expect(created_card.locator(".tool-title")).to_have_text("Created hello.py · 32 B")
    page.locator("#events .note", has_text="Done").wait_for(timeout=30_000)
    assert page.locator(".message.assistant strong").last.inner_text() == "Done."
    expect(page.locator("#working")).to_be_hidden()

    page.locator("#text").fill("Is it still there?")
    page.locator("#text").press("Control+Enter")
    page.locator("#events .message.assistant", has_text="Yes, it is still there.").wait_for(
        timeout=60_000
    )
    expect(page.locator("#status")).to_have_text("Done")
    assert page.evaluate("window.stillHere") is True
