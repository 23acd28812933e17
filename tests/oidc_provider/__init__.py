"""A real, certified OpenID Provider for the SSO tests: panva's oidc-provider (npm, from
package-lock.json) in a Node process on loopback (server.mjs), so that Quor's client is
checked against an OP it did not write.

The OP has one client, `quor` (its secret sent by client_secret_basic or
client_secret_post), requires PKCE with S256, releases `email` (email, email_verified),
`profile` (name, quor_role), `groups` (groups) and `quor_role` (quor_role), in the ID token
as well as at userinfo, and signs ID tokens with RS256 for 600 s. Its login form accepts
any login whose account a test wrote with `set_accounts`; `sub` is that login. Its state
(sessions, codes, grants) lives in the Node process: `rotate_keys` restarts it and so
forgets them.

Tests use the `openid_provider` fixture (this module is a pytest plugin of
tests/conftest.py), or `OpenIdProvider` directly when they need no Quor web process."""

import html
import json
import os
import re
import shutil
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx2
import pytest
from joserfc.jwk import RSAKey

from tests import conftest
from tests.environment import RUN_DIR, free_port

SERVER = Path(__file__).with_name("server.mjs")
CLIENT_ID = "quor"
CLIENT_SECRET = "oidc-provider-test-client-secret-0000000"
# The most requests one sign-in or sign-out takes at the OP (about six): more is a loop.
MAX_STEPS = 20


class OpenIdProvider:
    """The OP in its own process, and a browser of one user (a cookie jar) to sign in and
    out through its pages."""

    client_id = CLIENT_ID
    client_secret = CLIENT_SECRET

    def __init__(self, *, redirect_uris, post_logout_redirect_uris, backchannel_logout_uri=None):
        self._directory = Path(tempfile.mkdtemp(prefix="quor-oidc-provider-"))
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.redirect_uris = list(redirect_uris)
        self.post_logout_redirect_uris = list(post_logout_redirect_uris)
        self._keys = [_new_signing_key()]
        self._config = self._directory / "config.json"
        self._config.write_text(
            json.dumps(
                {
                    "issuer": self.issuer,
                    "port": self.port,
                    "clients": [
                        {
                            "client_id": CLIENT_ID,
                            "client_secret": CLIENT_SECRET,
                            "redirect_uris": self.redirect_uris,
                            "post_logout_redirect_uris": self.post_logout_redirect_uris,
                            **(
                                {
                                    "backchannel_logout_uri": backchannel_logout_uri,
                                    # sid in ID and logout tokens: one session ends
                                    "backchannel_logout_session_required": True,
                                }
                                if backchannel_logout_uri
                                else {}
                            ),
                        }
                    ],
                    "jwks_file": str(self._directory / "jwks.json"),
                    "accounts_file": str(self._directory / "accounts.json"),
                }
            )
        )
        self.set_accounts({})
        self._browser = httpx2.Client(follow_redirects=False, timeout=10)
        self._browser_login = None  # whose OP session the browser's cookies hold
        self._start()

    def set_accounts(self, accounts):
        """{login: claims}; the OP reads them at every sign-in and token request."""
        self._accounts = dict(accounts)
        (self._directory / "accounts.json").write_text(json.dumps(self._accounts))

    def rotate_keys(self):
        """Signs with a new key (a new kid) from now on. The JWKS still publishes the
        previous key, as an IdP's does while it rotates, so that ID tokens already
        issued stay verifiable (an id_token_hint at logout, say)."""
        self._keys = [_new_signing_key(), self._keys[0]]
        conftest._stop(self._process)
        self._start()

    def authorize(self, authorization_url, login):
        """Signs in as `login` through the OP's login and consent forms, as the user's
        browser would, and returns the URL the OP then sends the browser to: the RP's
        redirect_uri with `code` and `state`, or with `error`. The browser's OP session
        is reused when it is `login`'s, as a real browser's would be."""
        # oidc-provider 9 answers a login without an account with a 500 page.
        if login not in self._accounts:
            raise ValueError(f"no account {login!r} at the OP: set_accounts first")
        if login != self._browser_login:
            self._browser.cookies.clear()
        response = self._browser.get(authorization_url)
        login_submitted = False
        for _ in range(MAX_STEPS):
            if response.is_redirect:
                location = urljoin(str(response.url), response.headers["location"])
                if not self._is_own(location):
                    if login_submitted:
                        self._browser_login = login
                    return location
                response = self._browser.get(location)
                continue
            action, fields = _form_of(response)
            if fields.get("prompt") == "login":
                fields.update(login=login, password="any password")
                login_submitted = True
            response = self._browser.post(action, data=fields)
        raise RuntimeError(f"the sign-in took more than {MAX_STEPS} requests at the OP")

    def end_session(self, url):
        """Follows an RP-initiated logout URL, answers "Yes, sign me out" and returns
        where the OP then sends the browser: the post_logout_redirect_uri (with `state`),
        or the OP's own success page when the RP named none."""
        response = self._browser.get(url)
        for _ in range(MAX_STEPS):
            if response.is_redirect:
                location = urljoin(str(response.url), response.headers["location"])
                if not self._is_own(location):
                    return location
                response = self._browser.get(location)
            elif response.status_code == 200 and "<form" not in response.text:
                return str(response.url)
            else:
                # The confirm form holds only `xsrf`: its "Yes" button (logout=yes) sits
                # outside it, attached by form="op.logoutForm".
                action, fields = _form_of(response)
                response = self._browser.post(action, data={**fields, "logout": "yes"})
        raise RuntimeError(f"the sign-out took more than {MAX_STEPS} requests at the OP")

    def fill_in_login_and_consent(self, page, login):
        """The same two forms in a real browser (a Playwright page at the OP's login)."""
        page.fill("input[name=login]", login)
        page.fill("input[name=password]", "any password")
        page.click("button:has-text('Sign-in')")
        page.click("button:has-text('Continue')")

    def confirm_logout(self, page):
        """Answers the OP's "Do you want to sign-out" page in a real browser."""
        page.click("button:has-text('Yes, sign me out')")

    def stop(self):
        conftest._stop(self._process)
        self._browser.close()
        shutil.rmtree(self._directory)

    def _start(self):
        """Starts the OP with the current keys and waits until it answers; the OP forgot
        every session, so the browser's cookies go too."""
        (self._directory / "jwks.json").write_text(
            json.dumps({"keys": [key.as_dict(private=True) for key in self._keys]})
        )
        self._browser.cookies.clear()
        self._browser_login = None
        log_name = f"oidc-provider-{self.port}"
        self._process = conftest._start(
            ["node", str(SERVER), str(self._config)], os.environ, log_name
        )
        self._wait_until_ready(RUN_DIR / f"{log_name}.log")

    def _wait_until_ready(self, log, timeout=30):
        """Polls discovery; unlike tests.docker_helpers.wait_for_http it gives up as soon
        as the process exits, with its log (a bad config fails in a second, not a minute)."""
        deadline = time.monotonic() + timeout
        while self._process.poll() is None and time.monotonic() < deadline:
            try:
                httpx2.get(f"{self.issuer}/.well-known/openid-configuration").raise_for_status()
                return
            except httpx2.HTTPError:
                time.sleep(0.05)
        self._process.kill()
        raise RuntimeError(f"oidc-provider did not start:\n{log.read_text()}")

    def _is_own(self, url):
        return urlsplit(url)[:2] == urlsplit(self.issuer)[:2]


@pytest.fixture(scope="session")
def openid_provider(quor_web):
    """The OP, its client registered for Quor's callback and login page under the Django
    test client's host (http://testserver) and under the real web process (`quor_web`),
    which also gets its back-channel logouts.
    Shared by the session: a test sets the accounts it signs in with."""
    bases = ["http://testserver", quor_web]
    provider = OpenIdProvider(
        redirect_uris=[f"{base}/accounts/sso/callback/" for base in bases],
        post_logout_redirect_uris=[f"{base}/accounts/login/" for base in bases],
        backchannel_logout_uri=f"{quor_web}/accounts/sso/back-channel-logout/",
    )
    yield provider
    provider.stop()


class _FirstFormParser(HTMLParser):
    """The action and the named inputs of a page's first form."""

    def __init__(self):
        super().__init__()
        self.action = None
        self.fields = {}
        self._inside = False
        self._done = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "form" and not self._done:
            self.action = attributes.get("action") or ""
            self._inside = True
        elif tag == "input" and self._inside and attributes.get("name"):
            self.fields[attributes["name"]] = attributes.get("value") or ""

    def handle_endtag(self, tag):
        if tag == "form" and self._inside:
            self._inside = False
            self._done = True


def _form_of(response):
    """(action, fields) of the page's first form; a page without one is the OP's error."""
    parser = _FirstFormParser()
    parser.feed(response.text)
    if parser.action is None:
        raise RuntimeError(f"the OP answered {response.status_code}: {response.text[:2000]}")
    return urljoin(str(response.url), parser.action), parser.fields


def _new_signing_key():
    return RSAKey.generate_key(
        2048, parameters={"use": "sig", "alg": "RS256"}, private=True, auto_kid=True
    )


@pytest.fixture
def sso(org, openid_provider):
    """The `org` fixture's single sign-on through this OP, reading role and groups from
    its claims and creating members at their first sign-in."""
    from quor.models import SingleSignOn
    from tests import factories

    factories.make_verified_domain(org, "acme.test")
    return SingleSignOn.objects.create(
        organization=org,
        issuer=openid_provider.issuer,
        client_id=openid_provider.client_id,
        client_secret=openid_provider.client_secret,
        scopes="openid email profile groups quor_role",
        groups_claim="groups",
        role_claim="quor_role",
        creates_users=True,
    )


def quor_link_to_provider(response) -> str:
    """The authorization URL on Quor's "taking you to your identity provider" page (a
    page, not a redirect: tests of Quor's sign-in start there)."""
    assert response.status_code == 200, response.content
    found = re.search(r'id="sso-continue" href="([^"]+)"', response.content.decode())
    assert found, "no link to the identity provider on the page"
    return html.unescape(found.group(1))
