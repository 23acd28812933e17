"""Apps on the session pages: choosing them for a new session, seeing them on the
session, and what the session page needs for approval cards."""

import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders

from apps.models import App
from apps.policy import ANY_REQUEST, UNCATALOGED
from sandboxes.models import Session
from tests import factories


def make_app(organization, name, **fields):
    fields.setdefault("url_patterns", [f"https://{name.lower()}.example"])
    return App.objects.create(organization=organization, name=name, **fields)


@pytest.fixture
def apps(org, stranger):
    return {
        "github": make_app(org, "GitHub", catalog_key="github", description="Repositories & PRs"),
        "jira": make_app(org, "Jira", description="Issues <b>and</b> boards"),
        "disabled": make_app(org, "Dormant", enabled=False),
        "foreign": make_app(stranger.membership.organization, "Elsewhere"),
    }


def checkbox_values(page):
    return set(re.findall(r'<input type="checkbox" name="apps" value="(\d+)"', page))


@pytest.mark.django_db
def test_the_new_session_form_lists_only_the_organizations_enabled_apps(logged_in, org, apps):
    factories.make_provider(org)
    page = logged_in.get("/").content.decode()
    assert checkbox_values(page) == {str(apps["github"].pk), str(apps["jira"].pk)}
    assert "GitHub" in page and "Repositories &amp; PRs" in page
    assert "Issues &lt;b&gt;and&lt;/b&gt; boards" in page  # descriptions are escaped
    assert "Dormant" not in page
    assert "Elsewhere" not in page
    assert "sandboxes/session.css" in page


@pytest.mark.django_db
def test_without_enabled_apps_the_form_has_no_apps_section(logged_in, org):
    factories.make_provider(org)
    make_app(org, "Dormant", enabled=False)
    page = logged_in.get("/").content.decode()
    assert 'name="apps"' not in page
    assert "<legend>Apps</legend>" not in page


@pytest.mark.django_db(transaction=True)
def test_a_new_session_gets_the_chosen_apps(logged_in, org, apps, queued):
    provider = factories.make_provider(org)
    response = logged_in.post(
        "/sessions/new",
        {
            "prompt": "Merge the PR",
            "model": f"{provider.pk}:claude-test",
            "apps": [str(apps["github"].pk), str(apps["jira"].pk)],
        },
    )
    session = Session.objects.get()
    assert response["Location"] == f"/sessions/{session.pk}/"
    assert set(session.apps.all()) == {apps["github"], apps["jira"]}
    assert queued == [str(session.pk)]


@pytest.mark.django_db(transaction=True)
def test_a_new_session_without_apps_has_none(logged_in, org, apps, queued):
    provider = factories.make_provider(org)
    logged_in.post("/sessions/new", {"prompt": "Hi", "model": f"{provider.pk}:claude-test"})
    assert not Session.objects.get().apps.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("which", ["disabled", "foreign", "unknown", "not-a-number"])
def test_an_unknown_or_disabled_app_shows_the_reason_and_creates_nothing(
    logged_in, org, apps, queued, which
):
    provider = factories.make_provider(org)
    value = {"unknown": "999999", "not-a-number": "github"}.get(which) or str(apps[which].pk)
    response = logged_in.post(
        "/sessions/new",
        {
            "prompt": "Merge the PR",
            "model": f"{provider.pk}:claude-test",
            "apps": [str(apps["github"].pk), value],
        },
    )
    assert response.status_code == 400
    reason = re.findall(r'<p class="errors" id="apps-error">(.*?)</p>', response.content.decode())
    assert reason and "Apps" in reason[0]
    assert "Merge the PR</textarea>" in response.content.decode()
    assert not Session.objects.exists()
    assert queued == []


@pytest.mark.django_db
def test_the_session_page_lists_the_selected_apps(logged_in, owner, org, apps):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    session.apps.set([apps["jira"], apps["github"]])
    page = logged_in.get(f"/sessions/{session.pk}/").content.decode()
    chips = re.findall(r'<span class="app-chip">(.*?)</span>', page)
    assert chips == ["GitHub", "Jira"]
    assert "Dormant" not in page


@pytest.mark.django_db
def test_a_session_without_apps_shows_no_apps_line(logged_in, owner):
    session = factories.make_session(owner)
    page = logged_in.get(f"/sessions/{session.pk}/").content.decode()
    assert "app-chip" not in page


@pytest.mark.django_db
def test_the_session_page_has_what_approval_cards_need(logged_in, owner):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    page = logged_in.get(f"/sessions/{session.pk}/").content.decode()
    # The script renders the cards into the stream from the event stream (announced by
    # a separate status element, not piece by piece), and posts decisions with the
    # page's CSRF token (session-cookie auth).
    assert f'data-session-id="{session.pk}"' in page
    assert '<div id="events" aria-busy="false">' in page
    assert re.search(r'<p id="announcer" [^>]*role="status" aria-live="polite">', page)
    assert 'name="csrfmiddlewaretoken"' in page
    assert re.search(r'<div id="approval-alert" class="approval-alert" hidden>', page)
    assert 'id="approval-alert-text"' in page
    assert re.search(r'<button type="button" id="approval-alert-show"[^>]*>Show</button>', page)
    assert "sandboxes/session.js" in page and "sandboxes/session.css" in page
    # No inline scripts: every script is a file of Quor's own (the vendored Markdown
    # renderer, sanitizer and highlighter among them).
    scripts = re.findall(r"<script[^>]*>", page)
    assert all(re.fullmatch(r'<script src="/static/[^"]+\.js"( defer)?>', tag) for tag in scripts)
    for library in (
        "marked/marked.umd.js",
        "dompurify/purify.min.js",
        "highlight/highlight.min.js",
    ):
        assert any(f"/static/vendor/{library}" in tag for tag in scripts)


def test_the_session_script_handles_approval_events_and_posts_decisions():
    script = Path(finders.find("sandboxes/session.js")).read_text(encoding="utf-8")
    assert 'case "approval_requested":' in script
    assert 'case "approval_decided":' in script
    assert '"/api/v1/approvals/" + encodeURIComponent(' in script
    assert '"X-CSRFToken": csrfToken()' in script
    for label in ("Approve once", "Approve for this session", "Reject", "Expired"):
        assert label in script
    for decision in ("approve_once", "approve_session", "reject"):
        assert f'"{decision}"' in script
    # Approving a synthetic action for the session allows a whole App (custom App) or all
    # of a built-in App outside its catalog: the card says so.
    assert f'keys.includes("{ANY_REQUEST}")' in script
    assert f'keys.includes("{UNCATALOGED}")' in script
    assert '"This allows every request to " + appName + " in this session."' in script
    assert '" outside its catalog in this session."' in script
    # Data from events only ever goes in as text.
    assert "innerHTML" not in script.split("// Approvals:")[1].split("function render(")[0]
    assert finders.find("sandboxes/session.css")
