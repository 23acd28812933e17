"""The web app proxy: an ASGI application for requests to `<label>.<app base host>`.

It authenticates the viewer with the app's own cookie (set by the hand-off), checks
the session's sharing scope, and streams the request to the app server in the sandbox
and the response back, without buffering bodies; WebSockets are relayed both ways.
The viewer's credentials and identity never reach the app (`webapps.headers`)."""

import asyncio
import html
import time
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, quote

import aiohttp
from channels.db import database_sync_to_async

from webapps import headers as header_rules
from webapps import services

# How long a viewer's access check (and the app's address) is reused: each check costs
# a few milliseconds of database work, and a page loads dozens of files. Revoked access
# (sharing switched off, membership removed, sandbox stopped) takes effect within it.
# A verified viewer cookie (a signature check, about a fifth of a small request's CPU
# time) is reused as long, keyed by the whole Cookie header.
ACCESS_CACHE_SECONDS = 5.0
ACCESS_CACHE_ENTRIES = 10_000
# Request headers aiohttp's WebSocket client makes itself.
WEBSOCKET_HANDSHAKE = ("sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions")
CONNECT_TIMEOUT = 10


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _viewer_id(cookie_header: str, label: str) -> int | None:
    cookies = SimpleCookie()
    try:
        cookies.load(cookie_header)
    except Exception:
        return None
    morsel = cookies.get(services.VIEWER_COOKIE)
    return services.read_viewer_cookie(morsel.value, label) if morsel else None


def _target(scope) -> str:
    """The request target as the viewer sent it (path still percent-encoded)."""
    query = scope.get("query_string", b"").decode("latin-1")
    raw = scope.get("raw_path") or quote(scope["path"]).encode()
    return raw.decode("latin-1") + (f"?{query}" if query else "")


@database_sync_to_async
def _webapp_for(user_id, label):
    from django.db import close_old_connections

    from quor.lib.errors import NotFound
    from quor.models import User

    close_old_connections()
    user = User.objects.select_related("membership__organization").filter(pk=user_id).first()
    try:
        webapp = services.get_webapp_for_viewer(user, label)
    except NotFound:
        return None, None
    return webapp, services.upstream_address(webapp)


def _remember(cache: dict, key, value, now: float) -> None:
    """Caches `value` for ACCESS_CACHE_SECONDS; never more than ACCESS_CACHE_ENTRIES."""
    if len(cache) >= ACCESS_CACHE_ENTRIES:
        for old in [k for k, (expires, _) in cache.items() if expires <= now]:
            del cache[old]
        if len(cache) >= ACCESS_CACHE_ENTRIES:
            cache.clear()
    cache[key] = (now + ACCESS_CACHE_SECONDS, value)


class WebAppProxy:
    def __init__(self):
        self._client = None
        self._access: dict[tuple[int, str], tuple[float, tuple]] = {}
        self._viewers: dict[tuple[str, str], tuple[float, int]] = {}

    def viewer(self, scope, label) -> int | None:
        """The viewer's user id from the app's cookie, or None."""
        header = _header(scope, b"cookie")
        now = time.monotonic()
        cached = self._viewers.get((header, label))
        if cached and cached[0] > now:
            return cached[1]
        user_id = _viewer_id(header, label)
        if user_id is not None:  # only signed cookies: nobody else fills the cache
            _remember(self._viewers, (header, label), user_id, now)
        return user_id

    async def access(self, user_id, label):
        """(web app, upstream address) if the viewer may open it, else (None, None)."""
        if not user_id:
            return None, None
        now = time.monotonic()
        cached = self._access.get((user_id, label))
        if cached and cached[0] > now:
            return cached[1]
        found = await _webapp_for(user_id, label)
        _remember(self._access, (user_id, label), found, now)
        return found

    def client(self) -> aiohttp.ClientSession:
        """One connection pool per process (created inside the running event loop)."""
        if self._client is None or self._client.closed:
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._client

    async def close(self):
        if self._client is not None and not self._client.closed:
            await self._client.close()

    async def __call__(self, scope, receive, send):
        await self.serve(scope, receive, send, services.label_for_host(_header(scope, b"host")))

    async def serve(self, scope, receive, send, label):
        if scope["type"] == "http":
            await self.http(scope, receive, send, label)
        elif scope["type"] == "websocket":
            await self.websocket(scope, receive, send, label)

    # --- HTTP -----------------------------------------------------------------------------

    async def http(self, scope, receive, send, label):
        if scope["path"] == services.HANDOFF_PATH:
            return await self.handoff(scope, send, label)
        if _header(scope, b"sec-fetch-dest") == "document":
            # A top-level page of the app: show it framed by Quor's viewer instead.
            location = services.viewer_url(label, _target(scope))
            return await self.page(send, 302, "Opening the app in Quor.", location)
        user_id = self.viewer(scope, label)
        if user_id is None:
            location = services.login_url(label, _target(scope))
            return await self.page(send, 302, "Log in to Quor to open this app.", location)
        webapp, address = await self.access(user_id, label)
        if webapp is None:
            return await self.page(send, 404, "There is no such app, or it is not shared with you.")
        if address is None:
            return await self.page(
                send, 503, "This app is not running. Open its session in Quor to start it again."
            )
        await self.forward(scope, receive, send, address)

    async def handoff(self, scope, send, label):
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        user_id = services.read_handoff(query.get("token", [""])[0], label)
        webapp = (await _webapp_for(user_id, label))[0] if user_id else None
        if webapp is None:
            return await self.page(send, 404, "There is no such app, or it is not shared with you.")
        cookie = f"{services.VIEWER_COOKIE}={services.viewer_cookie(user_id, label)}; "
        cookie += services.viewer_cookie_attributes()
        next_path = services.safe_next(query.get("next", ["/"])[0])
        await send(
            {
                "type": "http.response.start",
                "status": 302,
                "headers": [
                    (b"location", next_path.encode("latin-1", "replace")),
                    (b"set-cookie", cookie.encode()),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                    (b"content-security-policy", header_rules.SANDBOX_CSP.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    async def forward(self, scope, receive, send, address):
        host, port = address
        forwarded = header_rules.request_headers_to_forward(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
        )
        forwarded.append(("host", f"localhost:{port}"))
        has_body = any(
            k.lower() in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"]
        )
        started = False
        body_read = not has_body  # then `receive()` is free to tell when the viewer goes

        async def body():
            nonlocal body_read
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ConnectionResetError("the viewer went away")
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    body_read = True
                    return

        try:
            async with self.client().request(
                scope["method"],
                f"http://{host}:{port}{_target(scope)}",
                headers=forwarded,
                data=body() if has_body else None,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            ) as response:
                returned = header_rules.response_headers_to_return(
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers
                )
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status,
                        "headers": [
                            (k.encode("latin-1"), v.encode("latin-1")) for k, v in returned
                        ],
                    }
                )
                started = True
                if body_read and not response.content.is_eof():
                    await _unless_viewer_leaves(_relay_body(response, send), receive)
                else:  # the whole body is here already (or the app answered mid-upload)
                    await _relay_body(response, send)
        except (TimeoutError, aiohttp.ClientError, ConnectionResetError):
            if started:  # cut mid-body: end it; the viewer sees a short response
                await send({"type": "http.response.body", "body": b""})
            else:
                await self.page(
                    send, 502, "The app did not answer. It may have stopped or crashed."
                )

    async def page(self, send, status: int, message: str, location: str | None = None):
        body = (
            "<!doctype html><meta charset=utf-8><title>Quor web app</title>"
            f"<p>{html.escape(message)}</p>"
        ).encode()
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            (b"content-security-policy", header_rules.SANDBOX_CSP.encode()),
        ]
        if location:
            headers.append((b"location", location.encode("latin-1", "replace")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # --- WebSocket ------------------------------------------------------------------------

    async def websocket(self, scope, receive, send, label):
        await receive()  # websocket.connect
        user_id = self.viewer(scope, label)
        webapp, address = await self.access(user_id, label)
        if webapp is None or address is None or not self._origin_allowed(scope, label):
            await send({"type": "websocket.close", "code": 4403})
            return
        host, port = address
        headers = [
            (name, value)
            for name, value in header_rules.request_headers_to_forward(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
            )
            if name not in WEBSOCKET_HANDSHAKE and name != "sec-websocket-protocol"
        ]
        headers.append(("host", f"localhost:{port}"))
        try:
            upstream = await self.client().ws_connect(
                f"ws://{host}:{port}{_target(scope)}",
                headers=headers,
                protocols=scope.get("subprotocols", ()),
                autoclose=False,
                autoping=True,
                max_msg_size=0,
            )
        except (TimeoutError, aiohttp.ClientError):
            await send({"type": "websocket.close", "code": 1011})
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.protocol})
        await self._relay(receive, send, upstream)

    def _origin_allowed(self, scope, label) -> bool:
        """The app's own origin, or "null": the preview iframe and the CSP sandbox give
        the app an opaque origin."""
        origin = _header(scope, b"origin")
        return origin in ("", "null", services.app_origin().origin(label))

    async def _relay(self, receive, send, upstream):
        async def viewer_to_app():
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    await upstream.close()
                    return
                if message.get("text") is not None:
                    await upstream.send_str(message["text"])
                elif message.get("bytes") is not None:
                    await upstream.send_bytes(message["bytes"])

        async def app_to_viewer():
            async for message in upstream:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await send({"type": "websocket.send", "text": message.data})
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await send({"type": "websocket.send", "bytes": message.data})
                else:
                    break
            await send({"type": "websocket.close", "code": upstream.close_code or 1000})

        tasks = [asyncio.ensure_future(viewer_to_app()), asyncio.ensure_future(app_to_viewer())]
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        # Retrieves what ended them: the viewer may be gone (the server's send() raises).
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()


async def _relay_body(response, send):
    async for chunk in response.content.iter_any():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _unless_viewer_leaves(relay, receive):
    """Runs `relay` until it ends or the viewer disconnects, whichever is first: the
    server's `send()` does not fail once the viewer has gone, and an endless response
    (server-sent events) would otherwise keep the app's connection open for ever."""

    async def viewer_gone():
        while (await receive())["type"] != "http.disconnect":
            pass

    relaying = asyncio.ensure_future(relay)
    watching = asyncio.ensure_future(viewer_gone())
    try:
        await asyncio.wait((relaying, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        relaying.cancel()
        watching.cancel()
    if relaying.done() and not relaying.cancelled():
        relaying.result()  # the relay's own errors, if any


def app_hosts_only(proxy: WebAppProxy):
    """The web app proxy process's application (`manage.py run_webapp_proxy`): requests
    to a web app's host go to the proxy; any other host gets a plain 404 (HTTP) or is
    refused (WebSocket): this process serves nothing of Quor's. Lifespan: the upstream
    connection pool closes on shutdown."""
    body = b"Not found.\n"
    not_found = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
    ]

    async def application(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await proxy.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        label = services.label_for_host(_header(scope, b"host"))
        if label:
            return await proxy.serve(scope, receive, send, label)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 404, "headers": not_found})
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4404})

    return application
