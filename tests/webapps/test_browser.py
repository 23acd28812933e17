"""Web apps in a real browser: headless Chromium (Debian's, driven by Playwright), logged
in to Quor through its login form, opens a web app served from a real sandbox through
the web app proxy's own process, in the session page's preview iframe and directly in
a tab. The test app's home page is a script that reports what it can reach
(`sandbox_app.py`, `PROBE_PAGE`): its origin, cookies, storage, Quor's page around it,
Quor's API, and whether its own script (a sub-resource) loaded."""

import json
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests import factories
from tests.browser import NetworkLog
from tests.environment import RUN_DIR
from webapps import gate
from webapps import headers as header_rules
from webapps import services as webapps

pytestmark = [pytest.mark.browser, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

QUOR = settings.QUOR_PUBLIC_URL.rstrip("/")
PREVIEW_SANDBOX = ["allow-scripts", "allow-forms", "allow-top-navigation-by-user-activation"]
THIRD_PARTY_COOKIES = (
    "Chromium blocks third-party cookies by default (Debian's chromium 156, a fresh "
    "profile): the viewer cookie is sent only where the app's host is the top-level site."
)


@pytest.fixture
def browser(request, headless_chromium):
    """A fresh browser profile (context) in headless Chromium, with default settings."""
    context = headless_chromium.new_context()
    context.set_default_timeout(20_000)
    network = NetworkLog(context)
    yield context
    if request.node.call_failed:  # in the report's "Captured stdout teardown"
        print(network.report())
        proxy_log = (RUN_DIR / "webapp-proxy.log").read_text().splitlines()
        print("the web app proxy's last lines:", *proxy_log[-20:], sep="\n")
    context.close()


def log_in(context, user):
    """Through Quor's login form, as a person does. Returns the page."""
    page = context.new_page()
    page.goto(f"{QUOR}/accounts/login/")
    page.fill("#id_username", user.email)
    page.fill("#id_password", factories.PASSWORD)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert urlsplit(page.url).path != "/accounts/login/", "the login failed"
    return page


def session_page(browser, owner, webapp):
    """The session page and its preview iframe of the web app."""
    page = log_in(browser, owner)
    page.goto(f"{QUOR}/sessions/{webapp.session_id}/")
    iframe = page.locator(f'iframe[src="/webapps/{webapp.label}/open"]')
    iframe.wait_for(state="attached")
    return page, iframe


def probe_results(frame) -> dict:
    """What the test app's page found out about itself, read from its DOM."""
    try:
        frame.wait_for_selector('#probe[data-done="true"]', state="attached", timeout=15_000)
    except PlaywrightTimeout:
        raise AssertionError(f"the app's page did not show (the frame is at {frame.url})") from None
    return json.loads(frame.text_content("#probe"))


def assert_the_app_is_boxed_in(result, *, framed):
    # An opaque origin: nothing of the app's host (cookies, storage) is reachable.
    assert result["origin"] == "null", result
    assert result["framed"] is framed
    cookie = result["cookie"]
    assert "error" in cookie or cookie["value"] == "", cookie
    assert "error" in result["localStorage"], result["localStorage"]
    if framed:  # nor is Quor's page around it
        assert "SecurityError" in result["parent"].get("error", ""), result["parent"]
    # Quor's API with the viewer's credentials: CORS refuses to let the script read it,
    # and without CORS the response is opaque (no status, no body).
    assert "TypeError" in result["fetch"].get("error", ""), result["fetch"]
    no_cors = result["fetchNoCors"]
    assert "error" in no_cors or (no_cors["type"] == "opaque" and no_cors["body"] == ""), no_cors


def test_the_session_page_frames_the_app_with_exactly_the_preview_sandbox(webapp, owner, browser):
    page, iframe = session_page(browser, owner, webapp)

    assert iframe.get_attribute("sandbox").split() == PREVIEW_SANDBOX
    tokens = iframe.evaluate("element => [...element.sandbox]")  # as the browser parsed it
    assert sorted(tokens) == sorted(PREVIEW_SANDBOX)
    link = page.get_by_role("link", name="Open in a new tab")
    assert link.get_attribute("href") == f"/webapps/{webapp.label}/"
    assert link.get_attribute("target") == "_blank"


def test_the_preview_iframe_shows_the_app_boxed_in(webapp, owner, browser):
    _, iframe = session_page(browser, owner, webapp)

    frame = iframe.element_handle().content_frame()
    result = probe_results(frame)  # the hand-off worked inside the iframe
    app_origin = webapps.app_origin().origin(webapp.label)
    assert frame.url == f"{app_origin}/"
    assert urlsplit(frame.url).netloc != urlsplit(QUOR).netloc
    assert result["subresource"] is True, "the app's own script did not load"
    assert_the_app_is_boxed_in(result, framed=True)


def app_frame(page, webapp):
    """The frame of Quor's full-window viewer that shows the app."""
    page.wait_for_url(f"{QUOR}/webapps/{webapp.label}/*")
    iframe = page.locator("iframe")
    assert iframe.get_attribute("sandbox").split() == PREVIEW_SANDBOX
    return iframe.element_handle().content_frame()


def test_opened_directly_the_app_runs_framed_by_quor_with_an_opaque_origin(webapp, owner, browser):
    """A top-level visit to the app's URL lands on Quor's viewer, which frames it: as a
    top-level opaque document its own requests would go without the viewer cookie
    wherever third-party cookies are blocked."""
    app_origin = webapps.app_origin().origin(webapp.label)
    page = log_in(browser, owner)
    app_responses = []
    page.on(
        "response",
        lambda response: (
            app_responses.append(response) if response.url.startswith(app_origin) else None
        ),
    )

    page.goto(f"{app_origin}/")
    frame = app_frame(page, webapp)
    result = probe_results(frame)

    assert frame.url == f"{app_origin}/"
    assert urlsplit(frame.url).netloc != urlsplit(QUOR).netloc
    assert result["subresource"] is True, "the app's own script did not load"
    assert_the_app_is_boxed_in(result, framed=True)
    handoffs = [r for r in app_responses if urlsplit(r.url).path == gate.HANDOFF_PATH]
    set_cookie = handoffs[-1].all_headers()["set-cookie"]
    for attribute in ("HttpOnly", "SameSite=None", "Secure", "Partitioned", "Path=/"):
        assert attribute in set_cookie, set_cookie
    assert "Domain" not in set_cookie
    for response in app_responses:  # every answer of the app's origin, redirects included
        assert response.headers["content-security-policy"] == header_rules.SANDBOX_CSP
        if urlsplit(response.url).path != gate.HANDOFF_PATH:
            assert "set-cookie" not in response.all_headers()
    assert "allow-same-origin" not in header_rules.SANDBOX_CSP
    assert {"sessionid", "csrftoken"} <= {cookie["name"] for cookie in browser.cookies(QUOR)}
    assert not {"sessionid", "csrftoken"} & {c["name"] for c in browser.cookies(f"{app_origin}/")}


def test_the_link_opens_the_app_in_a_tab(webapp, owner, browser):
    page, _ = session_page(browser, owner, webapp)
    with browser.expect_page() as opened:
        page.get_by_role("link", name="Open in a new tab").click()
    tab = opened.value
    result = probe_results(app_frame(tab, webapp))
    assert result["subresource"] is True, "the app's own script did not load"
    assert_the_app_is_boxed_in(result, framed=True)
