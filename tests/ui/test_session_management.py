"""Searching, renaming and deleting sessions from the session list, and the scheduled
task's buttons, in a browser."""

import pytest
from playwright.sync_api import expect

from quor.models import ModelProvider
from sandboxes.models import ScheduledTask, Session
from sandboxes.scheduling import services as scheduled
from tests import factories
from tests.ui.conftest import assert_accessible, assert_fits_the_width

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_search_rename_and_delete_from_the_session_list(ui, member):
    primes = factories.make_session(member, title="Primes up to 100", status="waiting")
    factories.make_event(primes, 1, "user_message", text="Print the primes up to 100.")
    factories.make_session(member, title="Weather report", status="waiting")

    page = ui.page_for(member, "/")
    page.get_by_role("searchbox", name="Search your sessions").fill("PRIMES")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("table.reflow tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("Primes up to 100")
    assert_fits_the_width(page)
    assert_accessible(page)
    ui.screenshot(page, "sessions-search")

    page.get_by_role("link", name="Rename “Primes up to 100”").click()
    page.get_by_label("Title").fill("Primes, checked")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status").first).to_have_text("Session renamed.")
    expect(page.get_by_role("searchbox")).to_have_value("PRIMES")  # back to the same search
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("Primes, checked")

    page.get_by_role("link", name="Delete “Primes, checked”").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Delete “Primes, checked”?")
    assert_fits_the_width(page)
    assert_accessible(page)
    page.get_by_role("button", name="Delete session").click()
    expect(page.get_by_role("status").first).to_have_text("Deleted “Primes, checked”.")
    expect(page.get_by_text("No session matching “PRIMES”.")).to_be_visible()
    assert list(Session.objects.values_list("title", flat=True)) == ["Weather report"]


def test_the_scheduled_task_edits_quietly_and_deletes_in_red_after_asking(ui, member):
    task = scheduled.scheduled_task_create(
        user=member, name="Daily report", prompt="Summarise", cron="0 9 * * *",
        timezone="UTC", model=f"{ModelProvider.objects.get().pk}:claude-sonnet",
    )  # fmt: skip
    page = ui.page_for(member, f"/scheduled/{task.pk}/")
    edit = page.get_by_role("link", name="Edit")
    delete = page.get_by_role("button", name="Delete")
    run = page.get_by_role("button", name="Run now")
    style = "e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).color]"
    primary = run.evaluate(style)
    assert edit.evaluate(style) != primary
    assert edit.evaluate(style)[0] == "rgb(255, 255, 255)"
    assert delete.evaluate(style)[1] == "rgb(180, 35, 24)"  # --danger
    assert_fits_the_width(page)
    assert_accessible(page)

    page.once("dialog", lambda dialog: dialog.dismiss())
    delete.click()
    assert ScheduledTask.objects.filter(pk=task.pk).exists()
    page.once("dialog", lambda dialog: dialog.accept())
    delete.click()
    page.wait_for_url("**/scheduled/")
    assert not ScheduledTask.objects.filter(pk=task.pk).exists()
