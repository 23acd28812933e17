"""Quor's pages in a real browser: headless Chromium (Debian's, driven by Playwright)
against Quor's web process (daphne, the `quor_web` fixture) on the test database, at a
desktop and a phone width. Data the page shows must be committed, so these tests use
`django_db(transaction=True)`.

`QUOR_SCREENSHOTS_DIR=docs/screenshots` makes `ui.screenshot()` write the pictures that
docs/ shows (`make screenshots`); otherwise screenshots are skipped."""

import json
import os
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from tests import factories
from tests.browser import NetworkLog

QUOR = settings.QUOR_PUBLIC_URL.rstrip("/")
AXE = Path(__file__).resolve().parents[2] / "node_modules/axe-core/axe.min.js"
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}


@pytest.fixture
def member(org):
    """A member of an organization with one model provider."""
    user = factories.make_user(org, email="ada@example.com")
    factories.make_provider(org, display_name="Anthropic", model_names=["claude-sonnet"])
    return user


@pytest.fixture(params=list(VIEWPORTS))
def viewport(request):
    """Each test that takes it runs at 1280 px and at 390 px wide."""
    return request.param


class BrowserPages:
    """Pages of one browser profile at one width, logged in as a given user."""

    def __init__(self, browser, viewport_name):
        self.viewport = viewport_name
        self.context = browser.new_context(
            viewport=VIEWPORTS[viewport_name], has_touch=viewport_name == "phone"
        )
        self.context.set_default_timeout(10_000)
        self.errors = []
        self.network = NetworkLog(self.context)

    def page_for(self, user, path="/"):
        """A new tab logged in as `user` (a session cookie of Django's own login), at `path`.
        Script errors and what the Content-Security-Policy blocked are collected in
        `self.errors`, which must be empty when the test ends."""
        if user is not None:
            client = Client()
            client.force_login(user)
            cookie = client.cookies[settings.SESSION_COOKIE_NAME]
            self.context.add_cookies(
                [{"name": cookie.key, "value": cookie.value, "url": QUOR, "secure": False}]
            )
        page = self.context.new_page()
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._note_policy_violation)
        page.goto(QUOR + path)
        return page

    def _note_policy_violation(self, message):
        """Chromium reports what the Content-Security-Policy blocked as a console error:
        a script, style or image of Quor's own that the policy refuses is a defect."""
        if message.type == "error" and "Content Security Policy" in message.text:
            self.errors.append(message.text)

    def screenshot(self, page, name):
        folder = os.environ.get("QUOR_SCREENSHOTS_DIR")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{folder}/{name}-{self.viewport}.png", full_page=True)

    def close(self):
        self.context.close()


@pytest.fixture
def ui(request, viewport, quor_web, headless_chromium):
    """Browser pages at one width, in a profile of the test's own."""
    pages = BrowserPages(headless_chromium, viewport)
    yield pages
    if request.node.call_failed:
        print(pages.network.report())  # in the report's "Captured stdout teardown"
    pages.close()
    assert not pages.errors, f"script errors on the page: {pages.errors}"


def accessibility_violations(page, *, impacts=("serious", "critical")):
    """axe-core's violations of the page as it is now, of the given impacts."""
    # Through DevTools, not a <script> tag, which Quor's Content-Security-Policy refuses.
    page.evaluate(f"() => {{ {AXE.read_text()}\n}}")
    result = page.evaluate("async () => JSON.stringify(await window.axe.run(document))")
    return [
        {
            "id": violation["id"],
            "impact": violation["impact"],
            "help": violation["help"],
            "nodes": [node["target"] for node in violation["nodes"]][:5],
        }
        for violation in json.loads(result)["violations"]
        if violation["impact"] in impacts
    ]


def assert_accessible(page):
    violations = accessibility_violations(page)
    assert not violations, json.dumps(violations, indent=1)


def assert_fits_the_width(page):
    """Nothing makes the page scroll sideways."""
    overflow = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert overflow[0] <= overflow[1], f"the page is {overflow[0]} px wide in {overflow[1]} px"
