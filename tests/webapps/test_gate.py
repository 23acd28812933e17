"""The web app proxy's pure decisions about a visitor, by table."""

import pytest

from webapps import gate

FRONT = gate.trusted_networks(["10.0.0.5", "10.1.0.0/16", "fd00::/8"])


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "visitor"),
    [
        # No front proxy trusted for this peer: its own address, whatever it claims.
        ("203.0.113.9", ["198.51.100.1"], "203.0.113.9"),
        ("10.0.0.6", ["198.51.100.1"], "10.0.0.6"),
        # A trusted front proxy: the address it appended.
        ("10.0.0.5", ["198.51.100.1"], "198.51.100.1"),
        ("10.0.0.5", [" 198.51.100.1 "], "198.51.100.1"),
        # What the visitor sent before is theirs to forge and never read.
        ("10.0.0.5", ["1.2.3.4, 198.51.100.1"], "198.51.100.1"),
        ("10.0.0.5", ["1.2.3.4", "198.51.100.1"], "198.51.100.1"),
        # A chain of trusted proxies: past each of them.
        ("10.0.0.5", ["1.2.3.4, 198.51.100.1, 10.1.2.3"], "198.51.100.1"),
        ("fd00::1", ["2001:db8::7, 10.0.0.5"], "2001:db8::7"),
        # Nothing forwarded, or only trusted hops: the last trusted hop.
        ("10.0.0.5", [], "10.0.0.5"),
        ("10.0.0.5", ["10.1.2.3"], "10.1.2.3"),
        # An entry that is no address stops the walk at the last trusted hop.
        ("10.0.0.5", ["198.51.100.1, unknown"], "10.0.0.5"),
        ("10.0.0.5", ["198.51.100.1, 10.1.2.3, _hidden"], "10.0.0.5"),
        ("10.0.0.5", ["unknown, 10.1.2.3"], "10.1.2.3"),
    ],
)
def test_the_visitors_address_is_read_past_trusted_front_proxies_only(peer, forwarded_for, visitor):
    assert gate.client_address(peer, forwarded_for, FRONT) == visitor


def test_without_trusted_proxies_x_forwarded_for_is_never_read():
    assert gate.client_address("127.0.0.1", ["198.51.100.1"], ()) == "127.0.0.1"


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("198.51.100.1", "198.51.100.1"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.1", "198.51.100.1"),
        ("", ""),
    ],
)
def test_sign_in_attempts_are_counted_per_ipv4_address_and_per_ipv6_64(address, key):
    assert gate.attempts_key(address) == key


def test_a_trusted_proxy_entry_that_is_no_address_is_named():
    with pytest.raises(ValueError, match=r"'proxy\.example'"):
        gate.trusted_networks(["10.0.0.5", "proxy.example"])


# --- route: the first step, from the request alone ------------------------------------

APP = dict(label="a1b2c3", link=False, method="GET", path="/", fetch_dest="", viewer=7)
LINK = dict(APP, label="p9x8y7", link=True, viewer=None)


def request_facts(base, **changes):
    return gate.RequestFacts(**{"body_read": True, **base, **changes})


@pytest.mark.parametrize(
    ("facts", "answer"),
    [
        # A host that is none of Quor's: a bare 404, whatever else the request says.
        (request_facts(APP, label=None), gate.Reply(404, "Not found.", plain=True)),
        (request_facts(LINK, label=None), gate.Reply(404, "Not found.", plain=True)),
        # A signed-in viewer's request for the app: its access is read next.
        (request_facts(APP), gate.CheckAccess(7)),
        (request_facts(APP, method="POST", fetch_dest="empty"), gate.CheckAccess(7)),
        (request_facts(APP, path="/__quor/link-password", method="POST"), gate.CheckAccess(7)),
        # No viewer cookie for this app: to Quor to log in, and back by the hand-off.
        (request_facts(APP, viewer=None), gate.Redirect("login", "Log in to Quor to open this app.")),
        (request_facts(APP, path=gate.HANDOFF_PATH, viewer=None), gate.HandOff()),
        (request_facts(APP, path=gate.HANDOFF_PATH), gate.HandOff()),
        # A top-level page, viewer or not: shown framed by Quor's viewer.
        (request_facts(APP, fetch_dest="document"), gate.Redirect("viewer", "Opening the app in Quor.")),
        (request_facts(APP, fetch_dest="document", viewer=None), gate.Redirect("viewer", "Opening the app in Quor.")),
        # A public link: never a viewer's cookie, redirect or hand-off; its link is read.
        (request_facts(LINK), gate.LookUpLink()),
        (request_facts(LINK, fetch_dest="document"), gate.LookUpLink()),
        (request_facts(LINK, path=gate.HANDOFF_PATH), gate.LookUpLink()),
        # A sign-in form's answer is read whole (and bounded) first.
        (request_facts(LINK, path=gate.LINK_PASSWORD_PATH, method="POST", body_read=False), gate.ReadBody(gate.MAX_FORM_BYTES)),
        (request_facts(LINK, path=gate.LINK_CODE_PATH, method="POST", body_read=False), gate.ReadBody(gate.MAX_FORM_BYTES)),
        (request_facts(LINK, path=gate.LINK_PASSWORD_PATH, method="POST"), gate.LookUpLink()),
        (request_facts(LINK, path=gate.LINK_PASSWORD_PATH, body_read=False), gate.LookUpLink()),
        (request_facts(LINK, path="/upload", method="POST", body_read=False), gate.LookUpLink()),
    ],
)  # fmt: skip
def test_a_request_is_routed_by_its_host_path_and_viewer(facts, answer):
    assert gate.route(facts) == answer


# --- visit: a public link's visitor, once the link and its quotas are read --------------

OPEN_LINK = dict(found=True, quota="", retry_after=0, path="/", visitor_auth="none", admitted=False)


def link_facts(**changes):
    return gate.LinkFacts(**{**OPEN_LINK, **changes})


ENDED = gate.Reply(404, "There is no such link, or it has ended.")
TOO_MANY = gate.Reply(
    429, "This link had too many requests this minute. Try again shortly.", retry_after=17
)
SERVED_ALL = gate.Reply(429, "This link has served all it may serve.")


@pytest.mark.parametrize(
    ("facts", "answer"),
    [
        (link_facts(found=False), ENDED),
        (link_facts(found=False, admitted=True, path=gate.LINK_PASSWORD_PATH), ENDED),
        # Quotas before anything else, sign-in forms included.
        (link_facts(quota=gate.REQUESTS_USED_UP, retry_after=17), TOO_MANY),
        (link_facts(quota=gate.REQUESTS_USED_UP, retry_after=17, path=gate.LINK_CODE_PATH), TOO_MANY),
        (link_facts(quota=gate.BANDWIDTH_USED_UP, admitted=True), SERVED_ALL),
        # The sign-in forms, whatever the link's authentication (the service checks it).
        (link_facts(path=gate.LINK_PASSWORD_PATH, visitor_auth="password"), gate.SignIn()),
        (link_facts(path=gate.LINK_EMAIL_PATH, visitor_auth="password"), gate.SignIn()),
        (link_facts(path=gate.LINK_CODE_PATH, visitor_auth="none", admitted=True), gate.SignIn()),
        # Quor's own paths are never the app's, nor anything else of Quor's.
        (link_facts(path=gate.HANDOFF_PATH), gate.Reply(404, "Not found.")),
        (link_facts(path="/__quor/anything", admitted=True), gate.Reply(404, "Not found.")),
        # A visitor with the link's cookie goes on; without it: the form, or a new visit.
        (link_facts(admitted=True, visitor_auth="password"), gate.Admit(new_visitor=False)),
        (link_facts(admitted=True), gate.Admit(new_visitor=False)),
        (link_facts(visitor_auth="password"), gate.SignInPage("password")),
        (link_facts(visitor_auth="email", path="/deep/page"), gate.SignInPage("email")),
        (link_facts(), gate.Admit(new_visitor=True)),
        (link_facts(path="/__quo/x"), gate.Admit(new_visitor=True)),
    ],
)  # fmt: skip
def test_a_links_visitor_is_admitted_only_within_its_quotas_and_past_its_sign_in(facts, answer):
    assert gate.visit(facts) == answer


# --- admit: the app, or the tunnel, and its address --------------------------------------

RUNNING_APP = dict(
    found=True, running=True, waking=False, websocket=False, origin_allowed=True, tunnel=False
)
TUNNEL = dict(RUNNING_APP, tunnel=True, max_body=1000)


def app_facts(base, **changes):
    return gate.AppFacts(**{**base, **changes})


TOO_LARGE = gate.Reply(413, "The request's body is too large.", close=True)


@pytest.mark.parametrize(
    ("facts", "answer"),
    [
        (app_facts(RUNNING_APP), gate.Forward()),
        (app_facts(RUNNING_APP, websocket=True), gate.Forward()),
        # Not found, or not for this viewer: one answer, so it tells nothing.
        (app_facts(RUNNING_APP, found=False), gate.Reply(404, gate.NO_SUCH_APP)),
        (app_facts(TUNNEL, found=False, running=False), gate.Reply(404, gate.NO_SUCH_APP)),
        # A sandbox that is not running: waking up (the page reloads), or stopped.
        (app_facts(RUNNING_APP, running=False, waking=True), gate.Reply(503, "Its sandbox was asleep and is waking up: this page reloads by itself.", refresh=gate.WAKING_RETRY_SECONDS)),
        (app_facts(RUNNING_APP, running=False), gate.Reply(503, "This app is not running. Open its session in Quor to start it again.")),
        # Another page's WebSocket to the app (cross-site WebSocket hijacking).
        (app_facts(RUNNING_APP, websocket=True, origin_allowed=False), gate.Reply(403, "This page may not open the app's WebSocket.")),
        (app_facts(TUNNEL, websocket=True, origin_allowed=False), gate.Reply(403, "This page may not open the app's WebSocket.")),
        # A sandbox's app streams bodies either way, however large.
        (app_facts(RUNNING_APP, content_length="99999999", has_body=True), gate.Forward()),
        # A tunnel's request: whole and bounded, its response body bounded too.
        (app_facts(TUNNEL), gate.Forward(room=1000)),
        (app_facts(TUNNEL, content_length="1000", has_body=True, body_read=True, body_bytes=1000), gate.Forward(room=1000)),
        (app_facts(TUNNEL, content_length="1001", has_body=True), TOO_LARGE),
        (app_facts(TUNNEL, content_length=" 1001 ", has_body=True), TOO_LARGE),
        (app_facts(TUNNEL, has_body=True, body_bytes=1001), TOO_LARGE),
        (app_facts(TUNNEL, content_length="10", has_body=True), gate.ReadBody(1000)),
        (app_facts(TUNNEL, has_body=True, expect_continue=True), gate.ReadBody(1000, continue_first=True)),
        (app_facts(TUNNEL, websocket=True), gate.Forward(room=1000)),
    ],
)  # fmt: skip
def test_an_app_or_tunnel_is_relayed_to_only_when_found_running_and_within_bounds(facts, answer):
    assert gate.admit(facts) == answer
