"""Public links from where a visitor and an attacker stand: plain HTTP and WebSocket
clients against the real web app proxy processes (`manage.py run_webapp_proxy`, two of
them for the quotas), the test app in a real sandbox behind them."""

import contextlib
import http.client
import json
import re
import socket
import sys
import time
from datetime import timedelta
from urllib.parse import urlencode, urlsplit

import pytest
import redis
from django.conf import settings
from django.core import signing
from django.utils import timezone

from quor.models import Organization
from sandboxes.models import Session
from tests.conftest import _start, _stop
from tests.docker_helpers import wait_for_port
from tests.environment import free_port
from tests.webapps.conftest import PROXY, cookie_for, fetch
from tests.webapps.test_webapp_proxy import HOSTILE_HEADERS
from webapps import gate, link_codes, link_quotas
from webapps import headers as header_rules
from webapps import services as webapps
from webapps.models import PublicLink, PublicLinkVisit

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery"


@pytest.fixture
def allowed(org, owner):
    Organization.objects.filter(pk=org.pk).update(allow_public_links=True)
    owner.membership.organization.refresh_from_db()


@contextlib.contextmanager
def proxy_process(env, log_name):
    """A web app proxy process of its own on a port of this worker's: (host, port)."""
    port = free_port()
    process = _start(
        [sys.executable, "manage.py", "run_webapp_proxy", "--bind", f"127.0.0.1:{port}"],
        env,
        log_name,
    )
    try:
        wait_for_port("127.0.0.1", port)
        yield "127.0.0.1", port
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def second_proxy(process_env):
    """Another web app proxy process, as a deployment with replicas runs: (host, port)."""
    with proxy_process(process_env, "webapp-proxy-2") as address:
        yield address


def make_link(owner, webapp, **fields) -> PublicLink:
    return webapps.public_link_create(
        user=owner,
        session=webapp.session,
        webapp_id=webapp.pk,
        expires_at=timezone.now() + timedelta(hours=1),
        **fields,
    )


def link_host(link) -> str:
    return urlsplit(webapps.app_origin().origin(link.label)).netloc


def visit(link, path="/echo", *, proxy=PROXY, method="GET", headers=None, body=None):
    connection = http.client.HTTPConnection(*proxy, timeout=30)
    connection.request(
        method, path, body=body, headers={"Host": link_host(link), **(headers or {})}
    )
    return connection.getresponse()


def set_cookies(response) -> list[str]:
    return response.headers.get_all("Set-Cookie") or []


def visitor_cookie(response) -> str:
    (cookie,) = set_cookies(response)
    assert cookie.startswith(webapps.LINK_COOKIE + "=")
    return cookie.split(";")[0]


def give_password(link, password, *, next_path="/echo", proxy=PROXY, headers=None):
    body = urlencode({"password": password, "next": next_path})
    return visit(
        link,
        gate.LINK_PASSWORD_PATH,
        proxy=proxy,
        method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded", **(headers or {})},
        body=body,
    )


@pytest.mark.usefixtures("allowed")
def test_a_visitor_gets_the_app_and_nothing_of_quor(webapp, owner):
    link = make_link(owner, webapp)
    response = visit(link, "/echo", headers=HOSTILE_HEADERS)
    assert response.status == 200
    received = {k.lower(): v for k, v in json.loads(response.read())["headers"].items()}
    for name in HOSTILE_HEADERS:
        assert name.lower() not in received, name
    assert not any(name.startswith("x-forwarded-") for name in received)
    # The app's own cookies are removed; the only cookie is the link's, on its host only.
    cookie = set_cookies(response)
    assert len(cookie) == 1 and cookie[0].startswith(webapps.LINK_COOKIE + "=")
    assert "HttpOnly" in cookie[0] and "Domain" not in cookie[0]
    assert response.getheader("Content-Security-Policy") == header_rules.SANDBOX_CSP
    # Quor's URLs on the link's host are the app's paths, never Quor's answers.
    api = visit(link, "/api/v1/sessions/", headers={"Cookie": cookie[0].split(";")[0]})
    assert json.loads(api.read())["path"] == "/api/v1/sessions/"
    # The visit is recorded: who opened what.
    (opened,) = PublicLinkVisit.objects.filter(link=link)
    assert opened.address == "127.0.0.1" and opened.authenticated_by == ""


@pytest.mark.usefixtures("allowed")
def test_the_link_is_no_way_into_quor_or_the_private_app(webapp, owner):
    link = make_link(owner, webapp)
    cookie = visitor_cookie(visit(link))
    # The visitor's cookie opens nothing on the app's private host.
    assert fetch(webapp, "/echo", headers={"Cookie": cookie}).status == 302
    # A hand-off minted for the private app is refused on the link's host.
    handoff = urlsplit(webapps.handoff_url(owner, webapp))
    refused = visit(link, f"{handoff.path}?{handoff.query}")
    assert refused.status == 404
    assert set_cookies(refused) == []
    # Nor does the app's own viewer cookie stand in for a link's password.
    protected = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    viewer = cookie_for(owner, webapp)
    assert visit(protected, "/echo", headers={"Cookie": viewer}).status == 401
    assert visit(protected, "/echo", headers={"Cookie": cookie}).status == 401


@pytest.mark.usefixtures("allowed")
def test_a_visitor_without_the_password_gets_only_the_form(webapp, owner):
    link = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    refused = visit(link, "/echo")
    assert refused.status == 401
    page = refused.read()
    assert b'name="password"' in page and b"headers" not in page  # the app said nothing
    assert set_cookies(refused) == []
    wrong = give_password(link, "not the password")
    assert wrong.status == 403
    assert set_cookies(wrong) == []
    assert not PublicLinkVisit.objects.exists()

    right = give_password(link, PASSWORD)
    assert right.status == 303
    assert right.getheader("Location") == "/echo"
    cookie = visitor_cookie(right)
    assert visit(link, "/echo", headers={"Cookie": cookie}).status == 200
    (opened,) = PublicLinkVisit.objects.filter(link=link)
    assert opened.authenticated_by == "password"
    # The cookie is this link's: another link to the same app asks its own password.
    other = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    assert visit(other, "/echo", headers={"Cookie": cookie}).status == 401


@pytest.mark.usefixtures("allowed")
def test_password_guesses_are_limited_across_proxy_processes(webapp, owner, second_proxy):
    link = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    for _ in range(link_quotas.SIGN_IN_ATTEMPTS):
        assert give_password(link, "a wrong guess").status == 403
    body = urlencode({"password": PASSWORD, "next": "/"})
    locked = visit(
        link, gate.LINK_PASSWORD_PATH, proxy=second_proxy, method="POST", body=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert locked.status == 429
    assert int(locked.getheader("Retry-After")) > 0
    assert set_cookies(locked) == []


@pytest.fixture(scope="module")
def proxy_behind_a_front_proxy(process_env):
    """A web app proxy whose front proxy is this host (the tests' address), and whose
    round of WebSocket checks comes every ten minutes: (host, port)."""
    env = {
        **process_env,
        "QUOR_WEBAPP_TRUSTED_PROXIES": "127.0.0.0/8",
        "QUOR_WEBAPP_WEBSOCKET_CHECK_SECONDS": "600",
    }
    with proxy_process(env, "webapp-proxy-fronted") as address:
        yield address


@pytest.mark.usefixtures("allowed")
def test_behind_a_front_proxy_one_visitors_guesses_lock_out_that_visitor_only(
    webapp, owner, proxy_behind_a_front_proxy
):
    """Every visitor comes through the front proxy's one address: before the trusted
    proxy setting, one guesser locked every visitor of the link out."""
    link = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    guesser = {"X-Forwarded-For": "203.0.113.5"}
    forged = {"X-Forwarded-For": "198.51.100.7, 203.0.113.5"}  # the guesser claiming another
    for _ in range(link_quotas.SIGN_IN_ATTEMPTS):
        wrong = give_password(link, "a guess", proxy=proxy_behind_a_front_proxy, headers=guesser)
        assert wrong.status == 403
    for headers in (guesser, forged):
        locked = give_password(link, PASSWORD, proxy=proxy_behind_a_front_proxy, headers=headers)
        assert locked.status == 429

    visitor = {"X-Forwarded-For": "198.51.100.7"}
    right = give_password(link, PASSWORD, proxy=proxy_behind_a_front_proxy, headers=visitor)

    assert right.status == 303
    (opened,) = PublicLinkVisit.objects.filter(link=link)
    assert opened.address == "198.51.100.7"


@pytest.mark.usefixtures("allowed")
def test_without_a_trusted_front_proxy_a_forged_x_forwarded_for_buys_no_more_guesses(webapp, owner):
    link = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    for number in range(link_quotas.SIGN_IN_ATTEMPTS):
        forged = {"X-Forwarded-For": f"198.51.100.{number}"}
        assert give_password(link, "a guess", headers=forged).status == 403

    locked = give_password(link, PASSWORD, headers={"X-Forwarded-For": "198.51.100.99"})

    assert locked.status == 429


@pytest.mark.usefixtures("allowed")
def test_an_expired_link_is_refused_even_with_its_cookie(webapp, owner):
    link = make_link(owner, webapp)
    cookie = visitor_cookie(visit(link))
    PublicLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    for headers in ({}, {"Cookie": cookie}):
        response = visit(link, "/echo", headers=headers)
        assert response.status == 404
        assert b"headers" not in response.read()


@pytest.mark.usefixtures("allowed")
@pytest.mark.parametrize(
    "ended_by", ["revoked", "session marked confidential", "organization switched links off"]
)
def test_a_link_ends_at_once(webapp, owner, org, client_for, ended_by):
    link = make_link(owner, webapp)
    cookie = {"Cookie": visitor_cookie(visit(link))}
    assert visit(link, "/echo", headers=cookie).status == 200  # the proxy has seen it
    if ended_by == "revoked":
        answer = client_for(owner).delete(f"/api/v1/public-links/{link.pk}/")
        assert answer.status_code == 204
    elif ended_by == "session marked confidential":
        Session.objects.filter(pk=webapp.session_id).update(confidential=True)
    else:
        Organization.objects.filter(pk=org.pk).update(allow_public_links=False)
    assert visit(link, "/echo", headers=cookie).status == 404  # the very next request


@pytest.mark.usefixtures("allowed")
@pytest.mark.parametrize(
    "ended_by", ["revoked", "session marked confidential", "organization switched links off"]
)
def test_an_open_websocket_of_a_link_closes_at_once_when_the_link_ends(
    webapp, owner, org, org_admin, proxy_behind_a_front_proxy, ended_by
):
    """The proxy's own round of checks is ten minutes away: the close comes from the
    word Quor sends when the link ends."""
    import websocket

    link = make_link(owner, webapp)
    host, port = proxy_behind_a_front_proxy
    connection = websocket.create_connection(
        f"ws://{host}:{port}/live",
        host=link_host(link),
        origin=webapps.app_origin().origin(link.label),
        timeout=20,
    )
    connection.send("hello")
    assert connection.recv() == "echo: hello"
    if ended_by == "revoked":
        webapps.public_link_revoke(user=owner, link=link)
    elif ended_by == "session marked confidential":
        webapps.session_set_confidential(actor=org_admin, session=webapp.session, confidential=True)
    else:
        webapps.organization_set_public_links(actor=org_admin, organization=org, allowed=False)

    connection.settimeout(30)
    with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
        connection.send("still there?")
        connection.recv()
        connection.recv()


def _a_minute_with_room(seconds: float) -> None:
    """The request quota counts per clock minute: start where the test's requests fit
    in one (a wait to the next minute, not a race)."""
    into = time.time() % 60
    if into > 60 - seconds:
        time.sleep(60 - into + 0.2)


@pytest.mark.usefixtures("allowed")
def test_a_request_quota_used_up_in_one_proxy_holds_in_another(webapp, owner, second_proxy):
    link = make_link(owner, webapp, requests_per_minute=3)
    _a_minute_with_room(20)
    cookie = {"Cookie": visitor_cookie(visit(link))}
    assert visit(link, "/echo", headers=cookie).status == 200
    assert visit(link, "/echo", headers=cookie).status == 200
    refused = visit(link, "/echo", proxy=second_proxy, headers=cookie)
    assert refused.status == 429
    assert 1 <= int(refused.getheader("Retry-After")) <= 60
    assert b"headers" not in refused.read()
    assert visit(link, "/echo", headers=cookie).status == 429


@pytest.mark.usefixtures("allowed")
def test_a_bandwidth_quota_used_up_in_one_proxy_holds_in_another(webapp, owner, second_proxy):
    link = make_link(owner, webapp, bandwidth_bytes=200_000)
    served = visit(link, "/stream?size=150000")
    assert served.status == 200 and len(served.read()) == 150_000
    counter = redis.Redis.from_url(settings.REDIS_URL)
    assert 150_000 < int(counter.get(f"{link_quotas.KEY_PREFIX}{link.pk}:bytes")) < 151_000

    too_large = visit(link, "/stream?size=100000", proxy=second_proxy)
    assert too_large.status == 429
    assert b"served all" in too_large.read()
    assert visit(link, "/stream?size=10", proxy=second_proxy).read() == b"x" * 10


@pytest.mark.usefixtures("allowed")
def test_parallel_requests_in_two_proxies_never_serve_more_than_the_links_bandwidth(
    webapp, owner, second_proxy
):
    """Each response's bytes are taken from the count before they are written: with the
    count checked before a request and added after it, all eight were served whole."""
    link = make_link(owner, webapp, bandwidth_bytes=300_000)
    host = link_host(link)
    connections = []
    for number in range(8):
        connection = socket.create_connection(second_proxy if number % 2 else PROXY, timeout=30)
        connections.append(connection)
    for connection in connections:  # all asked before any is answered
        connection.sendall(f"GET /stream?size=100000 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    answers = []
    for connection in connections:
        with connection:
            response = http.client.HTTPResponse(connection)
            response.begin()
            answers.append((response.status, len(response.read())))

    served = [size for status, size in answers if status == 200]
    assert served == [100_000] * len(served) and 1 <= len(served) <= 2, answers
    assert all(status == 429 for status, _ in answers if status != 200), answers


@pytest.mark.usefixtures("allowed")
def test_a_streamed_response_is_cut_where_the_links_bandwidth_ends(webapp, owner):
    link = make_link(owner, webapp, bandwidth_bytes=150_000)
    response = visit(link, "/chunked?size=400000")
    assert response.status == 200  # its length was unknown: the head went first
    with pytest.raises(http.client.IncompleteRead) as cut:
        response.read()
    assert 100_000 < len(cut.value.partial) <= 150_000

    # What was taken and not written went back: less is left than the next response needs.
    refused = visit(link, "/stream?size=65536")
    assert refused.status == 429 and b"served all" in refused.read()


# --- links restricted to email domains ------------------------------------------------------

ALLOWED = "visitor@example.com"


@pytest.fixture(autouse=True)
def no_link_counts_carried_over():
    """Codes asked for an address are counted whatever the link: each test starts anew."""
    counter = redis.Redis.from_url(settings.REDIS_URL)
    for key in counter.scan_iter(link_quotas.KEY_PREFIX + "*"):
        counter.delete(key)


def make_email_link(owner, webapp, domains=("example.com",)) -> PublicLink:
    return make_link(owner, webapp, visitor_auth="email", email_domains=list(domains))


def send_form(link, path, fields, *, proxy=PROXY):
    return visit(
        link,
        path,
        proxy=proxy,
        method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        body=urlencode({"next": "/echo", **fields}),
    )


def ask_code(link, address, **kwargs):
    return send_form(link, gate.LINK_EMAIL_PATH, {"email": address}, **kwargs)


def give_code(link, address, code, **kwargs):
    return send_form(link, gate.LINK_CODE_PATH, {"email": address, "code": code}, **kwargs)


def mailed_code(mailbox, address) -> str:
    message = mailbox.wait_for(address)
    (code,) = re.findall(r"\b\d{8}\b", message.get_payload())
    return code


def codes_mailed(mailbox) -> int:
    return len(mailbox.messages)


@pytest.mark.usefixtures("allowed")
def test_an_address_of_an_allowed_domain_gets_a_code_by_mail_and_the_code_opens_the_app(
    webapp, owner, mailbox
):
    link = make_email_link(owner, webapp)
    refused = visit(link, "/echo")
    assert refused.status == 401
    page = refused.read()
    assert b'name="email"' in page and b"headers" not in page  # the app said nothing
    assert b"example.com" not in page  # nor does the page say which domains may come in
    assert set_cookies(refused) == []
    # The password form's policy: no script at all, and not the sandbox (whose opaque
    # origin would make the link's cookie a third-party one).
    policy = refused.getheader("Content-Security-Policy")
    assert policy.startswith("default-src 'none';") and "sandbox" not in policy

    asked = ask_code(link, " Visitor@Example.COM ")  # as people type their address
    assert asked.status == 200
    assert b'name="code"' in asked.read() and set_cookies(asked) == []
    message = mailbox.wait_for(ALLOWED)
    assert message["From"] == settings.DEFAULT_FROM_EMAIL
    assert webapps.app_origin().origin(link.label) in message.get_payload()
    # Redis keeps no code, only its HMAC, and not for long.
    kept = redis.Redis.from_url(settings.REDIS_URL)
    code = mailed_code(mailbox, ALLOWED)
    stored = kept.hgetall(link_codes.code_key(link.pk, ALLOWED))
    assert code.encode() not in b"".join(stored.values())
    assert 0 < kept.ttl(link_codes.code_key(link.pk, ALLOWED)) <= link_codes.CODE_SECONDS

    admitted = give_code(link, ALLOWED, code)
    assert admitted.status == 303
    assert admitted.getheader("Location") == "/echo"
    cookie = visitor_cookie(admitted)
    assert visit(link, "/echo", headers={"Cookie": cookie}).status == 200
    # The cookie says how the visitor got in; it is the link's, never a Quor session's.
    value = cookie.split("=", 1)[1]
    carried = signing.loads(value, salt=webapps.LINK_VISITOR_SALT)
    assert carried == {"l": link.label, "a": "email", "e": ALLOWED}
    (opened,) = PublicLinkVisit.objects.filter(link=link)
    assert opened.authenticated_by == "email" and opened.email == ALLOWED


@pytest.mark.usefixtures("allowed")
@pytest.mark.parametrize(
    "outsider", ["someone@other.test", "visitor@sub.example.com", "visitor@example.com.evil.test"]
)
def test_an_address_of_another_domain_gets_no_mail_and_the_same_answer(
    webapp, owner, mailbox, outsider
):
    link = make_email_link(owner, webapp)
    outside = ask_code(link, outsider)
    inside = ask_code(link, ALLOWED)
    assert outside.status == inside.status == 200
    outside_page = outside.read().replace(outsider.encode(), b"ADDRESS")
    assert outside_page == inside.read().replace(ALLOWED.encode(), b"ADDRESS")
    mailbox.wait_for(ALLOWED)  # sent after the outsider's request, and arrived
    assert [recipients for recipients, _ in mailbox.messages] == [[ALLOWED]]
    # An outsider's guess at a code opens nothing either.
    assert give_code(link, outsider, "12345678").status == 403


@pytest.mark.usefixtures("allowed")
def test_a_wrong_a_used_and_an_expired_code_are_refused(webapp, owner, mailbox):
    link = make_email_link(owner, webapp)
    ask_code(link, ALLOWED)
    code = mailed_code(mailbox, ALLOWED)
    wrong = "00000000" if code != "00000000" else "11111111"
    refused = give_code(link, ALLOWED, wrong)
    assert refused.status == 403 and set_cookies(refused) == []
    assert give_code(link, "other@example.com", code).status == 403  # another address's
    assert give_code(link, ALLOWED, code).status == 303  # a wrong one does not void it
    assert give_code(link, ALLOWED, code).status == 403  # used once: gone

    mailbox.messages.clear()
    ask_code(link, ALLOWED)
    code = mailed_code(mailbox, ALLOWED)
    redis.Redis.from_url(settings.REDIS_URL).pexpire(link_codes.code_key(link.pk, ALLOWED), 1)
    time.sleep(0.05)
    expired = give_code(link, ALLOWED, code)
    assert expired.status == 403 and set_cookies(expired) == []
    assert PublicLinkVisit.objects.filter(link=link).count() == 1


@pytest.mark.usefixtures("allowed")
def test_too_many_wrong_codes_void_the_code_even_at_another_proxy(
    webapp, owner, mailbox, second_proxy
):
    link = make_email_link(owner, webapp)
    ask_code(link, ALLOWED)
    code = mailed_code(mailbox, ALLOWED)
    wrong = "00000000" if code != "00000000" else "11111111"
    for _ in range(link_codes.CODE_ATTEMPTS):
        assert give_code(link, ALLOWED, wrong).status == 403
    assert give_code(link, ALLOWED, code, proxy=second_proxy).status == 403
    assert not PublicLinkVisit.objects.exists()


@pytest.mark.usefixtures("allowed")
def test_codes_asked_for_one_address_are_limited_across_links_whatever_its_domain(
    webapp, owner, mailbox, second_proxy
):
    for address in (ALLOWED, "someone@other.test"):
        links = [make_email_link(owner, webapp) for _ in range(2)]
        for number in range(link_codes.CODES_PER_EMAIL):
            assert ask_code(links[number % 2], address).status == 200
        refused = ask_code(links[0], address, proxy=second_proxy)
        assert refused.status == 429
        assert int(refused.getheader("Retry-After")) > 0
    deadline = time.monotonic() + 10
    while codes_mailed(mailbox) < link_codes.CODES_PER_EMAIL:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert {tuple(recipients) for recipients, _ in mailbox.messages} == {(ALLOWED,)}


@pytest.mark.usefixtures("allowed")
def test_sign_in_attempts_at_an_email_link_are_limited_per_address(webapp, owner, second_proxy):
    link = make_email_link(owner, webapp)
    for number in range(link_quotas.SIGN_IN_ATTEMPTS):
        assert give_code(link, f"guess{number}@example.com", "12345678").status == 403
    locked = ask_code(link, ALLOWED, proxy=second_proxy)
    assert locked.status == 429


@pytest.mark.usefixtures("allowed")
def test_the_cookie_of_an_email_visitor_opens_no_other_link(webapp, owner, mailbox):
    link = make_email_link(owner, webapp)
    ask_code(link, ALLOWED)
    cookie = visitor_cookie(give_code(link, ALLOWED, mailed_code(mailbox, ALLOWED)))
    other = make_email_link(owner, webapp)
    assert visit(other, "/echo", headers={"Cookie": cookie}).status == 401
    assert fetch(webapp, "/echo", headers={"Cookie": cookie}).status == 302  # private host
    # Nor does a password link's cookie stand in for an email link's.
    protected = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    password_cookie = visitor_cookie(give_password(protected, PASSWORD))
    assert visit(link, "/echo", headers={"Cookie": password_cookie}).status == 401


@pytest.mark.usefixtures("allowed")
def test_the_email_forms_are_only_for_email_links(webapp, owner, mailbox):
    protected = make_link(owner, webapp, visitor_auth="password", password=PASSWORD)
    assert ask_code(protected, ALLOWED).status == 404
    link = make_email_link(owner, webapp)
    assert give_password(link, PASSWORD).status == 404
    assert ask_code(link, "not an address").status == 400
    assert visit(link, gate.LINK_EMAIL_PATH).status == 200  # the form, asked for
    assert mailbox.messages == []
