"""Web apps on the session page: sandboxed previews, a link to open them, and the
owner's sharing switch."""

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from sandboxes.models import Session
from tests import factories
from webapps.services import webapp_register

PREVIEW_SANDBOX = {"allow-scripts", "allow-forms", "allow-top-navigation-by-user-activation"}


class Tags(HTMLParser):
    """Every start tag of a page, as (tag, attributes)."""

    def __init__(self, page):
        super().__init__()
        self.tags = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def of(self, tag, **attributes):
        return [
            attrs
            for name, attrs in self.tags
            if name == tag and all(attrs.get(k) == v for k, v in attributes.items())
        ]


@pytest.fixture
def session(owner):
    return factories.make_session(owner, status=Session.Status.WAITING)


@pytest.fixture
def webapps(session):
    return [
        webapp_register(session=session, port=8000, command="python3 -m http.server 8000"),
        webapp_register(session=session, port=5173, command="npm run dev -- --host 0.0.0.0"),
    ]


def page_of(client, session):
    response = client.get(f"/sessions/{session.pk}/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_each_web_app_is_previewed_in_a_sandboxed_iframe_with_a_link(logged_in, session, webapps):
    page = page_of(logged_in, session)
    tags = Tags(page)

    frames = tags.of("iframe")
    assert len(frames) == 2
    for webapp in webapps:
        open_url = f"/webapps/{webapp.label}/open"
        [frame] = tags.of("iframe", src=open_url)
        tokens = frame["sandbox"].split()
        assert set(tokens) == PREVIEW_SANDBOX and len(tokens) == len(PREVIEW_SANDBOX)
        [link] = tags.of("a", href=f"/webapps/{webapp.label}/")  # Quor's full-window viewer
        assert link["target"] == "_blank"
        assert set(link["rel"].split()) == {"noopener", "noreferrer"}
    assert page.count(">Open in a new tab</a>") == 2
    assert "allow-same-origin" not in page
    assert 'id="webapps"' in page and '<section class="card webapps" id="webapps"' in page
    assert "hidden" not in tags.of("section", id="webapps")[0]


@pytest.mark.django_db
def test_the_command_is_shown_as_text(logged_in, session):
    webapp_register(session=session, port=8000, command="echo '<script>alert(1)</script>'")
    page = page_of(logged_in, session)

    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.django_db
def test_without_web_apps_the_panel_waits_hidden_for_the_first(logged_in, session):
    page = page_of(logged_in, session)
    tags = Tags(page)

    [panel] = tags.of("section", id="webapps")
    assert "hidden" in panel
    assert tags.of("ul", id="webapp-list") and not tags.of("iframe")


@pytest.mark.django_db
def test_the_page_has_no_inline_scripts(logged_in, session, webapps):
    page = page_of(logged_in, session)

    scripts = Tags(page).of("script")
    assert scripts and all(script.get("src") for script in scripts)
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)
    assert not re.search(r"\son[a-z]+=", page)  # no inline event handlers


def shown_sharing_help(tags):
    return [
        p["data-sharing-help"]
        for p in tags.of("p")
        if "data-sharing-help" in p and "hidden" not in p
    ]


@pytest.mark.django_db
def test_the_owner_sees_the_sharing_switch_with_the_current_choice(logged_in, session, webapps):
    tags = Tags(page_of(logged_in, session))

    [form] = tags.of("form", id="sharing-form")
    assert form["method"] == "post" and form["action"] == f"/sessions/{session.pk}/"
    radios = tags.of("input", type="radio", name="sharing")
    assert [r["value"] for r in radios] == ["private", "organization"]
    assert [r["value"] for r in radios if "checked" in r] == ["private"]

    # The help text says what the chosen option means (session.js follows a change).
    assert shown_sharing_help(tags) == ["private"]

    Session.objects.filter(pk=session.pk).update(sharing=Session.Sharing.ORGANIZATION)
    tags = Tags(page_of(logged_in, session))
    radios = tags.of("input", type="radio", name="sharing")
    assert [r["value"] for r in radios if "checked" in r] == ["organization"]
    assert shown_sharing_help(tags) == ["organization"]


@pytest.mark.django_db
def test_the_sharing_switch_changes_sharing_and_comes_back(logged_in, session):
    response = logged_in.post(f"/sessions/{session.pk}/", {"sharing": "organization"})

    assert response.status_code == 302
    assert response["Location"] == f"/sessions/{session.pk}/"
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.ORGANIZATION
    assert "My organization" in logged_in.get(response["Location"]).content.decode()

    logged_in.post(f"/sessions/{session.pk}/", {"sharing": "private"})
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.PRIVATE


@pytest.mark.django_db
def test_a_bad_sharing_value_changes_nothing_and_says_why(logged_in, session):
    response = logged_in.post(f"/sessions/{session.pk}/", {"sharing": "public"}, follow=True)

    assert response.status_code == 200
    assert "sharing must be one of private, organization." in response.content.decode()
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.PRIVATE


@pytest.mark.django_db
def test_nobody_but_the_owner_sees_the_page_or_switches_sharing(
    client, session, webapps, colleague, org_admin, stranger
):
    """Not even with Organization sharing: that opens the apps, not the session."""
    Session.objects.filter(pk=session.pk).update(sharing=Session.Sharing.ORGANIZATION)
    for user in (colleague, org_admin, stranger):
        client.force_login(user)
        assert client.get(f"/sessions/{session.pk}/").status_code == 404
        assert client.post(f"/sessions/{session.pk}/", {"sharing": "private"}).status_code == 404
    client.logout()
    response = client.post(f"/sessions/{session.pk}/", {"sharing": "private"})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.ORGANIZATION


@pytest.mark.django_db
def test_the_sharing_switch_needs_the_csrf_token(owner, session):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)

    assert browser.post(f"/sessions/{session.pk}/", {"sharing": "organization"}).status_code == 403
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.PRIVATE


@pytest.mark.django_db
def test_the_page_knows_the_last_seq_so_reloads_only_for_new_starts(logged_in, session, webapps):
    [root] = Tags(page_of(logged_in, session)).of("div", id="session")
    assert root["data-last-seq"] == str(session.events.order_by("-seq").first().seq)


def test_session_js_builds_previews_with_the_same_sandbox_and_text_only():
    script = Path(finders.find("sandboxes/session.js")).read_text()

    [tokens] = re.findall(r'const PREVIEW_SANDBOX = "([^"]+)";', script)
    assert set(tokens.split()) == PREVIEW_SANDBOX and len(tokens.split()) == 3
    assert "allow-same-origin" not in script
    assert 'case "webapp_started":' in script
    start = script.index("function showWebApp")
    body = script[start : script.index("\n  }\n", start)]
    assert "innerHTML" not in body and "textContent" in body
    assert 'link.rel = "noopener noreferrer"' in body and 'link.target = "_blank"' in body
    # Only Quor's own hand-off path is ever loaded (never a URL from the event as such).
    assert r"/^\/webapps\/[A-Za-z0-9_-]+\/open$/" in script
