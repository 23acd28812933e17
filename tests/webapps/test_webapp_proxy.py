"""Web apps through Quor's web app proxy: a test app runs inside a real sandbox (as the
sandbox user), the real web app proxy process (`manage.py run_webapp_proxy`) serves it
on the app's own host, and the viewer is a plain HTTP client carrying everything a
browser might."""

import hashlib
import json
import time
from urllib.parse import urlsplit

import pytest
from django.test import Client

from quor import services as quor_services
from sandboxes.models import Session
from sandboxes.runtime import services
from tests import factories
from tests.environment import PORTS
from tests.webapps.conftest import PROXY, app_host, cookie_for, fetch
from tests.webapps.sandbox_app import FRONT_SERVER_HEADERS
from webapps import gate
from webapps import headers as header_rules
from webapps import services as webapps

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

HOSTILE_HEADERS = {
    "Cookie": "sessionid=quor-session; csrftoken=quor-csrf; quor_webapp=handoff",
    "Authorization": "Bearer viewer-token",
    "Proxy-Authorization": "Basic dmlld2VyOnNlY3JldA==",
    "X-CSRFToken": "csrf-1",
    "X-CSRF-Token": "csrf-2",
    "X-XSRF-Token": "csrf-3",
    "Forwarded": "for=10.0.0.1",
    "X-Forwarded-For": "10.0.0.1",
    "X-Forwarded-Host": "quor.example",
    "X-Forwarded-Proto": "https",
    "X-Real-IP": "10.0.0.1",
    "Via": "1.1 corporate-proxy",
    "X-Remote-User": "ceo@acme.test",
    "X-Auth-Request-Email": "ceo@acme.test",
    "Remote-User": "ceo",
}


def test_no_viewer_credential_or_identity_reaches_the_app_and_no_cookie_comes_back(webapp, owner):
    cookie = cookie_for(owner, webapp)
    response = fetch(
        webapp, "/echo", headers={**HOSTILE_HEADERS, "Cookie": f"{cookie}; sessionid=x"}
    )
    assert response.status == 200
    received = {
        name.lower(): value for name, value in json.loads(response.read())["headers"].items()
    }
    for name in [*HOSTILE_HEADERS, "Cookie"]:
        assert name.lower() not in received, name
    assert not any(name.startswith("x-forwarded-") for name in received)
    assert response.getheader("Set-Cookie") is None
    for name, _ in FRONT_SERVER_HEADERS:  # a front server would act on them
        assert response.getheader(name) is None, name
    assert response.getheader("Content-Security-Policy") == header_rules.SANDBOX_CSP
    assert "allow-same-origin" not in header_rules.SANDBOX_CSP


def test_the_app_origin_differs_from_quors_and_quors_cookies_stay_home(webapp, owner):
    origin = urlsplit(webapps.app_origin().origin(webapp.label))
    assert origin.hostname == f"{webapp.label}.localhost"
    assert origin.hostname not in ("localhost", "127.0.0.1")
    login = Client().post(
        "/accounts/login/", {"username": owner.email, "password": factories.PASSWORD}
    )
    assert login.status_code == 302
    for name in ("sessionid", "csrftoken"):  # host-only: browsers never send them to app hosts
        assert login.cookies[name]["domain"] == "", name


@pytest.mark.parametrize(
    ("viewer", "sharing", "allowed"),
    [
        ("owner", "private", True),
        ("colleague", "private", False),
        ("stranger", "private", False),
        ("owner", "organization", True),
        ("colleague", "organization", True),
        ("stranger", "organization", False),
    ],
)
def test_who_may_open_the_app(webapp, request, viewer, sharing, allowed):
    Session.objects.filter(pk=webapp.session_id).update(sharing=sharing)
    user = request.getfixturevalue(viewer)
    browser = Client()
    browser.force_login(user)
    opened = browser.get(f"/webapps/{webapp.label}/open")
    assert opened.status_code == (302 if allowed else 404)
    forged = f"{webapps.VIEWER_COOKIE}={webapps.viewer_cookie(user.pk, webapp.label)}"
    response = fetch(webapp, "/echo", headers={"Cookie": forged})
    assert response.status == (200 if allowed else 404)


def test_an_anonymous_viewer_is_sent_to_log_in_and_back(webapp, owner):
    response = fetch(webapp, "/some/page?x=1")
    assert response.status == 302
    location = response.getheader("Location")
    assert location.startswith(f"http://127.0.0.1:{PORTS.WEB}/webapps/")
    assert "next=%2Fsome%2Fpage%3Fx%3D1" in location
    browser = Client()
    assert browser.get(urlsplit(location).path).status_code == 302  # to the login page
    browser.force_login(owner)
    path = urlsplit(location)
    handoff = browser.get(f"{path.path}?{path.query}")
    assert "next=%2Fsome%2Fpage%3Fx%3D1" in handoff["Location"]


def test_a_cookie_of_another_app_or_a_stale_handoff_is_refused(webapp, owner):
    other_label = "w0000000000000000"
    forged = f"{webapps.VIEWER_COOKIE}={webapps.viewer_cookie(owner.pk, other_label)}"
    assert fetch(webapp, "/echo", headers={"Cookie": forged}).status == 302
    assert fetch(webapp, f"{gate.HANDOFF_PATH}?token=garbage").status == 404


def test_streaming_ranges_uploads_and_server_sent_events(webapp, owner):
    cookie = {"Cookie": cookie_for(owner, webapp)}
    big = fetch(webapp, "/stream?size=20000000", headers=cookie)
    assert big.status == 200
    assert len(big.read()) == 20_000_000
    ranged = fetch(webapp, "/blob", headers={**cookie, "Range": "bytes=1000-1999"})
    assert ranged.status == 206
    assert ranged.getheader("Content-Range") == "bytes 1000-1999/1048576"
    assert ranged.read() == (bytes(range(256)) * 4096)[1000:2000]
    upload = b"u" * 5_000_000
    posted = fetch(webapp, "/upload", method="POST", headers=cookie, body=upload)
    assert json.loads(posted.read()) == {
        "received": len(upload),
        "sha256": hashlib.sha256(upload).hexdigest(),
    }
    events = fetch(webapp, "/events", headers=cookie)
    assert events.getheader("Content-Type") == "text/event-stream"
    assert events.read().decode().count("data: event") == 3


def test_websockets_pass_through(webapp, owner):
    import websocket

    cookie = cookie_for(owner, webapp)
    _open_websocket(webapp, owner).close()
    with pytest.raises(websocket.WebSocketBadStatusException):
        websocket.create_connection(
            f"ws://{PROXY[0]}:{PROXY[1]}/live", host=app_host(webapp),
            origin="http://evil.test", header=[f"Cookie: {cookie}"], timeout=10,
        )  # fmt: skip


def _open_websocket(webapp, viewer):
    import websocket

    connection = websocket.create_connection(
        f"ws://{PROXY[0]}:{PROXY[1]}/live",
        host=app_host(webapp),
        origin=webapps.app_origin().origin(webapp.label),
        header=[f"Cookie: {cookie_for(viewer, webapp)}"],
        timeout=20,
    )
    connection.send("hello")
    assert connection.recv() == "echo: hello"
    return connection


def _closed_within(connection, seconds: float) -> float:
    """How long until the proxy closed the tunnel; fails if it stays open longer."""
    import websocket

    started = time.monotonic()
    connection.settimeout(seconds)
    with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
        connection.send("still there?")
        connection.recv()  # the echo, if the tunnel is still open
        connection.recv()  # nothing more comes: the close, or the timeout
    return time.monotonic() - started


@pytest.mark.parametrize("taken_away_by", ["sharing switched off", "viewer deactivated"])
def test_an_open_websocket_closes_when_its_viewers_access_ends(webapp, colleague, taken_away_by):
    """An upgraded connection outlives the check that opened it: the proxy checks its
    viewer's access again, as often as its access cache expires (5 s)."""
    Session.objects.filter(pk=webapp.session_id).update(sharing="organization")
    connection = _open_websocket(webapp, colleague)

    if taken_away_by == "sharing switched off":
        Session.objects.filter(pk=webapp.session_id).update(sharing="private")
    else:
        quor_services.user_deactivate(user=colleague, via="admin")

    assert _closed_within(connection, 15) < 15


def test_an_open_websocket_stays_open_while_access_lasts(webapp, owner):
    connection = _open_websocket(webapp, owner)
    time.sleep(6)  # longer than the proxy's recheck (5 s): the tunnel must survive it

    connection.send("again")
    assert connection.recv() == "echo: again"
    connection.close()


def test_a_stopped_sandbox_shows_that_the_app_is_not_running(webapp, owner):
    cookie = {"Cookie": cookie_for(owner, webapp)}
    services.sandbox_stop(sandbox=webapp.session.sandbox)
    response = fetch(webapp, "/", headers=cookie)
    assert response.status == 503
    assert b"not running" in response.read()
