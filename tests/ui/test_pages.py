"""Every page of Quor's own UI, at a desktop and a phone width: nothing scrolls sideways,
axe-core finds no serious or critical problem, the navigation collapses on phones, and
error pages say what happened and where to go."""

import pytest
from playwright.sync_api import expect

from tests import factories
from tests.ui.conftest import assert_accessible, assert_fits_the_width

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def a_session(member):
    session = factories.make_session(member, title="Primes up to 100", status="waiting")
    factories.make_event(session, 1, "user_message", text="Print the primes up to 100.")
    factories.make_event(session, 2, "assistant_text", text="Done: **25** primes.")
    factories.make_event(session, 3, "turn_finished", usage={"input_tokens": 10})
    return session


@pytest.fixture
def a_handbook(org):
    """A knowledge source with one document everyone in the organization may read."""
    from knowledge import services
    from knowledge.principals import principal

    source = services.source_create(
        organization=org, name="Handbook", default_access=[principal("org", org.pk)]
    )
    document = services.document_put_content(
        source=source,
        name="travel-policy.md",
        data=b"# Travel policy\n\nBook economy class for flights under six hours.",
    )
    return services.document_index(document.pk)


def pages_of(session):
    return {
        "sessions": "/",
        "session": f"/sessions/{session.pk}/",
        "scheduled": "/scheduled/",
        "scheduled-new": "/scheduled/new",
        "apps": "/apps/",
        "api-tokens": "/account/tokens/",
        "knowledge": "/knowledge/?q=economy+flights",
    }


def test_every_page_fits_the_screen_and_passes_the_accessibility_check(
    ui, member, a_session, a_handbook
):
    for name, path in pages_of(a_session).items():
        page = ui.page_for(member, path)
        if name == "session":  # its conversation arrives over the WebSocket
            expect(page.locator("#events .message.assistant")).to_contain_text("25 primes")
        if name == "knowledge":
            expect(page.locator(".search-results")).to_contain_text("economy class")
        assert_fits_the_width(page)
        assert_accessible(page)
        ui.screenshot(page, name)
        page.close()


def test_the_admin_pages_an_organization_admin_uses_pass_the_accessibility_check(
    ui, org_admin, org, a_handbook
):
    """The admin is where App policies are set (Django's own pages, Quor's admin classes)."""
    app = factories.make_app(org, name="FakeHub")
    for name, path in {
        "admin": "/admin/",
        "admin-apps": "/admin/integrations/app/",
        "admin-app": f"/admin/integrations/app/{app.pk}/change/",
        "admin-knowledge-source": f"/admin/knowledge/knowledgesource/{a_handbook.source_id}/change/",
        "admin-knowledge-document": f"/admin/knowledge/knowledgedocument/{a_handbook.pk}/change/",
    }.items():
        page = ui.page_for(org_admin, path)
        expect(page.locator("#content")).to_be_visible()
        assert_accessible(page)
        if ui.viewport == "desktop":
            ui.screenshot(page, name)
        page.close()


def test_the_login_page_fits_and_passes_the_accessibility_check(ui):
    page = ui.page_for(None, "/accounts/login/")
    assert_fits_the_width(page)
    assert_accessible(page)
    ui.screenshot(page, "login")


def test_the_navigation_collapses_behind_a_menu_button_on_a_phone(ui, member):
    page = ui.page_for(member, "/")
    menu = page.get_by_role("button", name="Menu")
    scheduled = page.get_by_role("link", name="Scheduled")
    if ui.viewport == "phone":
        expect(menu).to_be_visible()
        expect(scheduled).to_be_hidden()
        menu.click()
        expect(menu).to_have_attribute("aria-expanded", "true")
        scheduled.click()
        page.wait_for_url("**/scheduled/")
    else:
        expect(scheduled).to_be_visible()
        expect(menu).to_be_hidden()


def test_another_users_session_is_a_branded_not_found_page(ui, member, a_session, colleague):
    page = ui.page_for(colleague, "/")
    response = page.goto(page.url + f"sessions/{a_session.pk}/")
    assert response.status == 404
    assert page.get_by_role("heading", level=1).inner_text().startswith("This page does not exist")
    assert "Primes up to 100" not in page.content()
    assert_accessible(page)
    ui.screenshot(page, "not-found")
    page.get_by_role("link", name="Go to your sessions").click()
    page.wait_for_url("**/")
