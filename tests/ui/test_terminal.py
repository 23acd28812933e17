"""The session page's terminal in a real browser: xterm.js on the terminal WebSocket to a
real Docker sandbox, within the page's Content-Security-Policy (the `ui` fixture fails
the test on any script error or policy violation), across a dropped connection, and the
replay of a recording."""

import time

import pytest
from playwright.sync_api import expect

from sandboxes.models import Session, TerminalOutput, TerminalRecording
from sandboxes.terminal import services as terminal
from tests import factories

pytestmark = [pytest.mark.browser, pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["desktop"])
def viewport(request):
    """The terminal does not depend on the width: one is enough."""
    return request.param


@pytest.fixture
def session(owner, running_sandbox):
    return factories.make_session(owner, sandbox=running_sandbox, status=Session.Status.WAITING)


def recorded_output(session) -> str:
    return "".join(
        TerminalOutput.objects.filter(recording__session=session, kind="o").values_list(
            "data", flat=True
        )
    )


def wait_until(page, condition, timeout: float, what: str):
    """Waits in Playwright's own way: its handlers (a new socket's route) run only while
    the test calls into it."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        page.wait_for_timeout(100)
    return value


def type_command(page, command: str) -> None:
    page.locator("#terminal-screen").click()
    page.keyboard.type(command)
    page.keyboard.press("Enter")


def test_the_owner_types_in_the_terminal_and_it_survives_a_dropped_connection(ui, owner, session):
    sockets = []

    def relay_and_keep(socket):
        socket.connect_to_server()
        sockets.append(socket)

    ui.context.route_web_socket("**/terminal/**", relay_and_keep)
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    page.get_by_role("button", name="Open the terminal").click()
    expect(page.locator("#terminal-screen canvas").first).to_be_visible()
    type_command(page, "export KEPT=yes; echo typed-$((6*7))")
    wait_until(page, lambda: "typed-42" in recorded_output(session), 60, "the shell answered")

    sockets[0].close(code=1011, reason="dropped by the test")
    wait_until(page, lambda: len(sockets) == 2, 30, "the page attached again")
    wait_until(page, lambda: "rows=" in sockets[1].url, 5, "the size in the new socket")
    type_command(page, "echo still-$KEPT-$((7*6))")
    wait_until(
        page, lambda: "still-yes-42" in recorded_output(session), 60, "the same shell answered"
    )
    assert TerminalRecording.objects.filter(session=session).count() == 1


def test_an_ended_terminal_says_why_and_its_recording_replays(ui, owner, session):
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    page.get_by_role("button", name="Open the terminal").click()
    type_command(page, "echo bye-$((2*21))")
    wait_until(page, lambda: "bye-42" in recorded_output(session), 60, "the shell answered")
    type_command(page, "exit")
    expect(page.locator("#terminal-status")).to_contain_text(
        terminal.ENDED_BY_SHELL, timeout=30_000
    )
    expect(page.get_by_role("button", name="Open the terminal again")).to_be_visible()

    page.reload()
    with page.expect_response(lambda r: r.url.endswith(".cast")) as answer:
        page.get_by_role("button", name="Replay").click()
    assert answer.value.status == 200
    assert "bye-42" in answer.value.text()
    expect(page.locator("#terminal-replay canvas").first).to_be_visible()
    expect(page.get_by_role("link", name="Download", exact=True)).to_have_attribute(
        "href", f"/sessions/{session.pk}/terminal/{session.terminal_recordings.get().pk}.cast"
    )
