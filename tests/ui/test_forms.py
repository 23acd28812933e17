"""The new-session form in a browser: it checks the prompt's length (with a counter) and
the chosen files before anything is sent, and a form the server refuses comes back
with everything typed."""

import pytest
from django.conf import settings
from playwright.sync_api import expect

from sandboxes.models import Session, Skill
from tests import factories
from tests.ui.conftest import assert_accessible, assert_fits_the_width

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def member(org):
    user = factories.make_user(org, email="ada@example.com")
    factories.make_provider(org, display_name="Anthropic", model_names=["fast", "careful"])
    return user


def test_the_browser_refuses_a_prompt_too_long_and_files_too_many_or_too_big(ui, member):
    page = ui.page_for(member, "/")
    prompt, counter = page.locator("#prompt"), page.locator("#prompt-count")
    limit = settings.QUOR_MAX_PROMPT_CHARS
    expect(counter).to_have_text(f"0 / {limit:,} characters")
    prompt.fill("two\nlines")  # the browser sends a line break as two characters
    expect(counter).to_have_text(f"10 / {limit:,} characters")

    prompt.fill("x" * (limit + 1))
    expect(counter).to_have_text(f"This is 1 character too long: at most {limit:,}.")
    expect(counter).to_have_class("note counter over")
    expect(prompt).to_have_attribute("aria-invalid", "true")
    page.get_by_role("button", name="Start").click()
    assert page.evaluate("() => document.querySelector('#prompt').validity.customError")
    assert page.url.endswith("/")  # not sent

    prompt.fill("Read the attached files")
    expect(prompt).not_to_have_attribute("aria-invalid", "true")
    files = page.locator("#attachments")
    check = page.locator("#attachments-check")
    many = [
        {"name": f"note-{n}.txt", "mimeType": "text/plain", "buffer": b"hi"}
        for n in range(settings.QUOR_MAX_ATTACHMENTS + 1)
    ]
    files.set_input_files(many)
    expect(check).to_have_text(
        f"You chose {len(many)} files; at most {settings.QUOR_MAX_ATTACHMENTS} can be attached."
    )
    # Made in the page: sending 20 MB through DevTools would take seconds.
    page.evaluate(
        """size => {
            const input = document.querySelector('#attachments');
            const files = new DataTransfer();
            files.items.add(new File([new Uint8Array(size)], 'big.bin'));
            input.files = files.files;
            input.dispatchEvent(new Event('change'));
        }""",
        settings.QUOR_MAX_ATTACHMENT_BYTES + 1,
    )
    expect(check).to_contain_text("big.bin is larger than 20 MB, the most one file can be.")
    page.get_by_role("button", name="Start").click()
    assert page.url.endswith("/")
    assert_fits_the_width(page)
    assert_accessible(page)
    ui.screenshot(page, "new-session-checks")

    files.set_input_files([{"name": "ok.txt", "mimeType": "text/plain", "buffer": b"fine"}])
    expect(check).to_be_hidden()
    assert page.evaluate("() => document.querySelector('#attachments').validity.valid")
    assert not Session.objects.exists()


def test_a_form_the_server_refuses_comes_back_filled_in(ui, member, org):
    factories.make_app(org, name="Tracker")
    Skill.objects.create(organization=org, name="report", description="Writes reports")
    page = ui.page_for(member, "/")
    page.locator("#prompt").fill("Write the weekly report\nfrom the tracker's issues")
    page.locator("#title").fill("Weekly report")
    page.locator("#model").select_option(label="Anthropic · careful")
    page.get_by_role("checkbox", name="report").check()
    page.get_by_role("checkbox", name="Tracker").check()
    Skill.objects.all().delete()  # gone while the form was open: the server refuses it

    page.get_by_role("button", name="Start").click()
    expect(page.get_by_role("alert").first).to_contain_text("The session was not started.")
    expect(page.locator("#prompt")).to_have_value(
        "Write the weekly report\nfrom the tracker's issues"
    )
    expect(page.locator("#title")).to_have_value("Weekly report")
    expect(page.locator("#model option:checked")).to_have_text("Anthropic · careful")
    expect(page.get_by_role("checkbox", name="Tracker")).to_be_checked()
    expect(page.locator("#skills-error")).to_have_count(0)  # no Skill left to show it beside
    expect(page.get_by_role("alert").first).to_contain_text("Unknown Skills: report.")
    assert_fits_the_width(page)
    assert_accessible(page)
    assert not Session.objects.exists()


def test_start_says_the_session_is_starting_at_once_and_sends_only_once(ui, member):
    page = ui.page_for(member, "/")
    posts = []

    def answer_with_no_page(route):
        """204: the browser stays on the form, as it looks while the real answer comes."""
        posts.append(route.request.url)
        route.fulfill(status=204)

    page.route("**/sessions/new", answer_with_no_page)
    page.locator("#prompt").fill("Say hello")
    page.get_by_role("button", name="Start").click()
    busy = page.locator("form.new-session button[type=submit]")
    expect(busy).to_have_text("Starting the session…")
    expect(busy).to_have_attribute("aria-disabled", "true")
    busy.click(force=True)  # a person clicking again: aria-disabled does not stop it
    page.wait_for_timeout(300)
    assert len(posts) == 1
