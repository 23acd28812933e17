"""The API tokens page in a browser: a new token is shown once with a working copy
button, and a token is revoked after a confirmation."""

import pytest
from playwright.sync_api import expect

from quor.models import ApiToken
from tests import factories
from tests.ui.conftest import QUOR, assert_accessible, assert_fits_the_width

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_token_is_shown_once_copied_and_revoked(ui, org):
    member = factories.make_user(org, email="ada@example.com")
    ui.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=QUOR)
    page = ui.page_for(member, "/account/tokens/")
    expect(page.get_by_text("No tokens yet.")).to_be_visible()
    page.get_by_label("Name").fill("CI pipeline")
    page.get_by_role("button", name="Create token").click()

    value = page.locator("#new-token").input_value()
    assert value.startswith("quor_pat_")
    page.get_by_role("button", name="Copy").click()
    expect(page.locator("#new-token-copied")).to_have_text("Copied.")
    assert page.evaluate("() => navigator.clipboard.readText()") == value
    assert_fits_the_width(page)
    assert_accessible(page)
    ui.screenshot(page, "api-token-created")

    page.goto(QUOR + "/account/tokens/")
    assert value not in page.content()
    row = page.get_by_role("row").filter(has_text="CI pipeline")
    expect(row).to_contain_text(value[:15])  # recognised by its first characters

    page.once("dialog", lambda dialog: dialog.dismiss())
    row.get_by_role("button", name="Revoke").click()
    assert ApiToken.objects.get().revoked_at is None
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    expect(page.get_by_role("status").first).to_contain_text("Revoked “CI pipeline”")
    expect(row).to_contain_text("Revoked")
    assert ApiToken.objects.get().revoked_at is not None
