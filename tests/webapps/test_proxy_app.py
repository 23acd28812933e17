"""The web app proxy process's application (`app_hosts_only`) and the proxy's caches,
without a server: plain ASGI calls."""

import asyncio

from webapps import proxy as proxy_module
from webapps import services
from webapps.proxy import WebAppProxy, app_hosts_only


def call(app, scope, messages=()):
    """Runs the ASGI app with these incoming messages; returns what it sent."""
    sent = []
    incoming = list(messages)

    async def receive():
        return incoming.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def test_any_host_but_an_apps_gets_a_plain_404():
    app = app_hosts_only(WebAppProxy())
    for host in (b"localhost:18001", b"127.0.0.1:18001", b"quor.example", b"a.b.localhost"):
        sent = call(app, {"type": "http", "path": "/", "headers": [(b"host", host)]})
        assert sent[0]["status"] == 404, host
        assert sent[1]["body"] == b"Not found.\n"
    sent = call(app, {"type": "websocket", "path": "/", "headers": [(b"host", b"localhost")]})
    assert sent == [{"type": "websocket.close", "code": 4404}]


def test_an_apps_host_reaches_the_proxy():
    app = app_hosts_only(WebAppProxy())
    scope = {
        "type": "http",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": [(b"host", b"wabc.localhost:18001")],
    }
    sent = call(app, scope)
    assert sent[0]["status"] == 302  # no viewer cookie: off to log in to Quor
    assert b"/webapps/wabc/" in dict(sent[0]["headers"])[b"location"]


def test_lifespan_starts_and_closes_the_upstream_pool():
    proxy = WebAppProxy()
    closed = []

    async def close():
        closed.append(True)

    proxy.close = close
    sent = call(
        app_hosts_only(proxy),
        {"type": "lifespan"},
        [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}],
    )
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert closed == [True]


def test_only_signed_viewer_cookies_are_cached(monkeypatch):
    proxy = WebAppProxy()
    good = f"{services.VIEWER_COOKIE}={services.viewer_cookie(7, 'wabc')}"

    def scope(cookie):
        return {"headers": [(b"cookie", cookie.encode())]}

    assert proxy.viewer(scope(f"{services.VIEWER_COOKIE}=forged"), "wabc") is None
    assert proxy.viewer(scope(good), "wabcd") is None  # another app's host
    assert proxy._viewers == {}
    assert proxy.viewer(scope(good), "wabc") == 7
    checks = []
    monkeypatch.setattr(proxy_module, "_viewer_id", lambda *args: checks.append(args))
    assert proxy.viewer(scope(good), "wabc") == 7
    assert checks == []  # reused, not checked again


def test_the_caches_never_grow_past_their_bound(monkeypatch):
    monkeypatch.setattr(proxy_module, "ACCESS_CACHE_ENTRIES", 3)
    cache = {}
    for n in range(10):
        proxy_module._remember(cache, n, "value", now=100.0)
        assert len(cache) <= 3
    cache = {}
    for n in range(3):
        proxy_module._remember(cache, n, "value", now=100.0)
    proxy_module._remember(cache, "later", "value", now=200.0)  # the others have expired
    assert list(cache) == ["later"]
