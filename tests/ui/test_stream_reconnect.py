"""The session page's stream across a dropped connection, in a real browser: what was
said while the page was cut off arrives when it reconnects, once each, in order, and
nothing it already showed comes twice."""

import pytest
from playwright.sync_api import expect

from sandboxes.models import Session
from sandboxes.sessions.events import session_events_append
from tests import factories

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["desktop"])
def viewport(request):
    """The stream does not depend on the width: one is enough."""
    return request.param


def test_a_dropped_connection_loses_and_repeats_nothing(ui, owner):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    session_events_append(
        session=session,
        events=[("user_message", {"text": "Count to five."}), ("session_started", {})],
    )
    sockets = []

    def relay_and_keep(socket):
        socket.connect_to_server()  # messages pass both ways unchanged
        sockets.append(socket)

    ui.context.route_web_socket("**/ws/sessions/**", relay_and_keep)
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    texts = page.locator("#events .message.assistant .text")

    session_events_append(session=session, events=[("assistant_text", {"text": "One."})])
    expect(texts).to_have_text(["One."])
    assert "after=0" in sockets[0].url

    sockets[0].close(code=1011, reason="dropped by the test")
    session_events_append(
        session=session,
        events=[("assistant_text", {"text": "Two."}), ("assistant_text", {"text": "Three."})],
    )
    expect(texts).to_have_text(["One.", "Two.", "Three."], timeout=15_000)
    assert len(sockets) == 2 and "after=3" in sockets[1].url

    session_events_append(
        session=session,
        events=[("assistant_text", {"text": "Four."}), ("turn_finished", {"usage": {}})],
        status_from=[Session.Status.RUNNING],
        status_to=Session.Status.WAITING,
    )
    expect(texts).to_have_text(["One.", "Two.", "Three.", "Four."])
    expect(page.locator("#status")).to_have_text("Done")
    expect(page.locator("#events .message.user")).to_have_count(1)


def test_an_event_appended_beside_the_browser_is_published_not_only_stored(
    headless_chromium, owner, caplog
):
    """Playwright marks its event loop as running in this thread; publishing to the
    channel layer (async_to_sync, after the commit) must still work beside it, or the
    pages of these tests get events only from the stream's catch-up read."""
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    session_events_append(session=session, events=[("assistant_text", {"text": "One."})])
    errors = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert errors == []
