"""The sandbox's state on the session page, in a real browser: asleep, waking with its
progress, failed to wake with the cause and what to do; the page follows the state as
it changes (the states are set on the row: no Docker)."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from sandboxes.models import Sandbox
from tests import factories
from tests.ui.conftest import assert_accessible, assert_fits_the_width

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def session_in(owner, **sandbox_fields):
    sandbox = factories.make_sandbox(owner, has_workspace=True, **sandbox_fields)
    return factories.make_session(owner, sandbox=sandbox, title="Report")


def test_an_asleep_sandbox_says_so_and_offers_to_wake_it(ui, owner):
    session = session_in(owner, state=Sandbox.State.SLEEPING)
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    state = page.locator("#sandbox-state")
    expect(state.get_by_role("heading")).to_have_text("Your sandbox is asleep")
    expect(state).to_contain_text("your files are kept")
    expect(page.get_by_role("button", name="Wake it up and show the files")).to_be_visible()
    expect(page.locator("#sandbox-state-label")).to_have_text("Sandbox: asleep")
    # No empty "/" listing while it sleeps, and no progress: nothing is happening.
    expect(page.locator("#files-browser")).to_be_hidden()
    expect(page.locator("#sandbox-progress")).to_be_hidden()
    assert_accessible(page)
    assert_fits_the_width(page)
    ui.screenshot(page, "sandbox-asleep")


def test_a_waking_sandbox_shows_its_progress_then_a_failed_wake_its_cause(ui, owner):
    session = session_in(owner, state=Sandbox.State.RESTORING)
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    state = page.locator("#sandbox-state")
    expect(state.get_by_role("heading")).to_have_text("Waking up your sandbox")
    expect(page.locator("#sandbox-progress progress")).to_be_visible()
    expect(page.locator("#sandbox-elapsed")).to_have_text(re.compile(r"^[1-9]\d* s$"))
    expect(page.locator("#sandbox-wake")).to_be_hidden()
    assert_accessible(page)
    ui.screenshot(page, "sandbox-waking")

    # The wake fails (as services._wake records it): the page learns it by itself.
    Sandbox.objects.filter(pk=session.sandbox_id).update(
        state=Sandbox.State.SLEEPING,
        failure_reason="Could not wake up: the disk is full",
    )
    expect(state.get_by_role("heading")).to_have_text(
        "Your sandbox could not wake up", timeout=5000
    )
    expect(page.locator("#sandbox-reason")).to_have_text(
        "Reason: Could not wake up: the disk is full"
    )
    expect(page.locator("#sandbox-advice")).to_contain_text("tell your administrator")
    expect(page.get_by_role("button", name="Try again")).to_be_visible()
    expect(page.locator("#sandbox-progress")).to_be_hidden()
    expect(page.locator("#sandbox-state-label")).to_have_text("Sandbox: could not wake up")
    assert_accessible(page)
    assert_fits_the_width(page)
    ui.screenshot(page, "sandbox-wake-failed")


def test_a_lost_workspace_points_to_the_notice_and_offers_no_wake(ui, owner):
    session = session_in(
        owner,
        state=Sandbox.State.UNRESTORABLE,
        failure_reason="Could not restore the workspace: it has no snapshot.",
    )
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    state = page.locator("#sandbox-state")
    expect(state.get_by_role("heading")).to_have_text("Your workspace could not be restored")
    expect(state).to_contain_text("See the notice at the top of the page")
    expect(page.locator("#sandbox-reason")).to_contain_text("it has no snapshot")
    expect(page.locator("#sandbox-wake")).to_be_hidden()
    expect(page.locator("#files-browser")).to_be_hidden()
    assert_accessible(page)


def set_tab_hidden(page, hidden):
    page.evaluate(
        """(hidden) => {
            Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        hidden,
    )


def test_a_sandbox_falling_asleep_while_the_page_is_open_shows_within_a_minute(ui, owner):
    """While it runs, the page asks for the sandbox's state every minute, never while the
    tab is hidden, and that read never counts as use (it never keeps the sandbox awake)."""
    session = session_in(owner, state=Sandbox.State.RUNNING)
    factories.make_event(session, 1, "assistant_text", text="Ready.")
    # The folder's listing needs a real sandbox: answered here, the state is the row's.
    listing = {"results": [], "truncated": False}
    ui.context.route(re.compile(r"/files/\?path="), lambda route: route.fulfill(json=listing))
    asked = []
    ui.context.on("request", lambda r: "/api/v1/sandbox/" in r.url and asked.append(r.url))
    ui.context.clock.install()
    page = ui.page_for(owner, f"/sessions/{session.pk}/")
    label = page.locator("#sandbox-state-label")
    expect(page.locator("#files")).to_contain_text("No files yet")
    expect(label).to_have_text("Sandbox: running")
    # The stream is connected (its connection is use, recorded before the event came):
    # from here on only the page's own reads reach the sandbox's row.
    expect(page.locator("#events .message.assistant")).to_contain_text("Ready.")
    # A listing slower than 800 ms (a loaded machine) has the page ask for the state while
    # it waits, the tab still shown; the listing is in now, so only reads from here count.
    del asked[:]

    # It falls asleep while the tab is hidden: nothing is asked.
    set_tab_hidden(page, True)
    quiet_since = timezone.now() - timedelta(minutes=10)
    Sandbox.objects.filter(pk=session.sandbox_id).update(
        state=Sandbox.State.SLEEPING, last_activity_at=quiet_since
    )
    page.clock.run_for("03:00")
    assert asked == []
    expect(label).to_have_text("Sandbox: running")

    # Shown again: asked at once, and it says so.
    set_tab_hidden(page, False)
    expect(label).to_have_text("Sandbox: asleep")
    expect(page.locator("#sandbox-state").get_by_role("heading")).to_have_text(
        "Your sandbox is asleep"
    )
    expect(page.locator("#files-browser")).to_be_hidden()
    assert len(asked) == 1

    # Running again (woken elsewhere), then asleep: the next minute's read shows it.
    Sandbox.objects.filter(pk=session.sandbox_id).update(state=Sandbox.State.RUNNING)
    listing["truncated"] = True  # tells the listing the wake asks for from the first one
    page.clock.run_for("00:16")
    expect(label).to_have_text("Sandbox: running")
    # Its answer is a state too, newer than any read asked before it came: it must be in
    # before the row changes, or it hides the next read's answer for a minute.
    expect(page.locator("#files")).to_contain_text("More entries are not shown.")
    Sandbox.objects.filter(pk=session.sandbox_id).update(state=Sandbox.State.SLEEPING)
    page.clock.run_for("01:01")
    expect(label).to_have_text("Sandbox: asleep")
    sandbox = Sandbox.objects.get(pk=session.sandbox_id)
    assert sandbox.last_activity_at == quiet_since  # the reads were not use
