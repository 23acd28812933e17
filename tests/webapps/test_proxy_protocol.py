"""The web app proxy's HTTP/1.1 relay on real sockets, without a sandbox or a database:
the proxy (`webapps.proxy.serve`, on uvloop as in `run_webapp_proxy`) runs in a thread
beside two app servers on loopback, an aiohttp app and a raw one that misbehaves on
purpose; the viewer is a plain socket or http.client. Access is granted by filling the
proxy's access cache (the real checks are tested against a real sandbox in
test_webapp_proxy.py)."""

import asyncio
import hashlib
import http.client
import json
import socket
import threading
import time

import pytest
import uvloop
from aiohttp import web

from tests.environment import PORTS
from webapps import gate, services
from webapps import headers as header_rules
from webapps import proxy as proxy_module
from webapps.proxy import WebAppProxy, serve

VIEWER_ID = 7
APP, RAW, DOWN, ASLEEP = "wapp", "wraw", "wdown", "wasleep"


class AppServer:
    """An aiohttp app recording what it received."""

    def __init__(self):
        self.connections = set()  # the proxy's connections, by their port
        self.received = []
        self.events_closed = threading.Event()
        self.big_written = 0

    def application(self) -> web.Application:
        app = web.Application(client_max_size=100 * 1024 * 1024, middlewares=[self.note])
        app.router.add_route("*", "/echo", self.echo)
        app.router.add_get("/small", self.small)
        app.router.add_post("/upload", self.upload)
        app.router.add_get("/events", self.events)
        app.router.add_get("/big", self.big)
        app.router.add_get("/ws", self.websocket)
        return app

    @web.middleware
    async def note(self, request, handler):
        """Every request the app read, whatever its path: one with no route counts too."""
        self.connections.add(request.transport.get_extra_info("peername")[1])
        self.received.append(request)
        return await handler(request)

    async def small(self, request):
        return web.Response(text="abc", headers={"Set-Cookie": "app=1", "X-App": "yes"})

    async def echo(self, request):
        return web.json_response({"method": request.method, "headers": dict(request.headers)})

    async def upload(self, request):
        digest, size = hashlib.sha256(), 0
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            size += len(chunk)
        return web.json_response({"received": size, "sha256": digest.hexdigest()})

    async def events(self, request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b"data: tick\n\n")
                await asyncio.sleep(0.01)
        finally:
            self.events_closed.set()

    async def big(self, request):
        response = web.StreamResponse(headers={"Content-Length": str(200 * 1024 * 1024)})
        await response.prepare(request)
        block = b"b" * 1024 * 1024
        for _ in range(200):
            await response.write(block)  # waits while the proxy does not read
            self.big_written += len(block)
        return response

    async def websocket(self, request):
        socket_ = web.WebSocketResponse()
        await socket_.prepare(request)
        async for message in socket_:
            await socket_.send_str(f"echo: {message.data}")
        return socket_


async def raw_app(reader, writer):
    """An app server that answers by the path: without a length, with an interim
    response first, with garbage, or (`/once`) once per connection and then never."""
    answered = 0
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        path = head.split(b" ")[1]
        if path == b"/no-length":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n" + b"n" * 100_000)
            writer.close()
            return
        if path == b"/early-hints":
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        elif path == b"/bad":
            writer.write(b"this is not http\r\n\r\n")
        elif path.startswith(b"/once"):
            if answered:  # as a server closing an idle connection just as a request comes
                writer.close()
                return
            answered += 1
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nonce")
        await writer.drain()


class Stack:
    def __init__(self):
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.app = AppServer()
        self.proxy = WebAppProxy()
        self.runner = self.call(self._start())

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(15)

    async def _start(self):
        runner = web.AppRunner(self.app.application())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        app_port = site._server.sockets[0].getsockname()[1]
        raw = await asyncio.start_server(raw_app, "127.0.0.1", 0)
        down = socket.socket()
        down.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        self.down = down
        self.server = await serve(self.proxy, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        forever = time.monotonic() + 3600
        for label, port in ((APP, app_port), (RAW, raw.sockets[0].getsockname()[1])):
            found = (object(), ("127.0.0.1", port), False)
            self.proxy._access[(VIEWER_ID, label)] = (forever, found)
        down_port = down.getsockname()[1]
        self.proxy._access[(VIEWER_ID, ASLEEP)] = (forever, (object(), None, True))
        self.proxy._access[(VIEWER_ID, DOWN)] = (
            forever,
            (object(), ("127.0.0.1", down_port), False),
        )
        self.raw = raw
        return runner

    async def _stop(self):
        self.server.close()
        self.raw.close()
        self.proxy.close()
        await self.runner.cleanup()

    def stop(self):
        self.call(self._stop())
        self.down.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def headers(self, label=APP, **extra) -> dict:
        return {
            "Host": f"{label}.localhost:{PORTS.WEBAPP_PROXY}",
            "Cookie": f"{services.VIEWER_COOKIE}={services.viewer_cookie(VIEWER_ID, label)}",
            **extra,
        }

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def get(self, path, label=APP, method="GET", body=None, **headers):
        connection = self.connection()
        connection.request(method, path, body=body, headers=self.headers(label, **headers))
        return connection.getresponse()

    def raw_socket(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def head_lines(self, label=APP, **extra) -> bytes:
        return "".join(f"{k}: {v}\r\n" for k, v in self.headers(label, **extra).items()).encode()


@pytest.fixture
def stack():
    running = Stack()
    yield running
    running.stop()


def read_until_closed(sock) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_small_requests_reuse_one_kept_alive_connection_to_the_app(stack):
    connection = stack.connection()
    for _ in range(3):
        connection.request("GET", "/small", headers=stack.headers())
        response = connection.getresponse()
        assert response.read() == b"abc"
        assert response.getheader("Set-Cookie") is None
        assert response.getheader("X-App") == "yes"
        assert response.getheader("Content-Security-Policy") == header_rules.SANDBOX_CSP
    assert len(stack.app.connections) == 1
    forwarded = stack.app.received[-1].headers
    assert forwarded["Host"].startswith("localhost:")
    assert "Cookie" not in forwarded


def test_a_chunked_upload_and_one_expecting_100_continue_reach_the_app_whole(stack):
    body = [b"x" * 300_000, b"y" * 700_000]
    connection = stack.connection()
    connection.request(
        "POST", "/upload", body=iter(body), headers=stack.headers(), encode_chunked=True
    )
    assert json.loads(connection.getresponse().read()) == {
        "received": 1_000_000,
        "sha256": hashlib.sha256(b"".join(body)).hexdigest(),
    }
    assert "Transfer-Encoding" in stack.app.received[-1].headers

    sock = stack.raw_socket()
    sock.sendall(
        b"POST /upload HTTP/1.1\r\n"
        + stack.head_lines(**{"Content-Length": "5", "Expect": "100-continue"})
        + b"\r\n"
    )
    assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"  # the proxy says it, not the app
    sock.sendall(b"hello")
    answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert hashlib.sha256(b"hello").hexdigest().encode() in answer
    assert "Expect" not in stack.app.received[-1].headers


def test_a_head_request_gets_headers_only_and_the_connection_stays_usable(stack):
    connection = stack.connection()
    connection.request("HEAD", "/small", headers=stack.headers())
    head = connection.getresponse()
    assert head.status == 200
    assert head.getheader("Content-Length") == "3"
    assert head.read() == b""
    connection.request("GET", "/small", headers=stack.headers())
    assert connection.getresponse().read() == b"abc"


def test_a_response_ended_by_the_app_closing_reaches_the_viewer_whole(stack):
    response = stack.get("/no-length", label=RAW)
    assert response.getheader("Transfer-Encoding") == "chunked"
    assert response.read() == b"n" * 100_000

    sock = stack.raw_socket()  # HTTP/1.0 has no chunks: the proxy closes at the end instead
    sock.sendall(b"GET /no-length HTTP/1.0\r\n" + stack.head_lines(RAW) + b"\r\n")
    answer = read_until_closed(sock)
    assert answer.endswith(b"\r\n\r\n" + b"n" * 100_000)
    assert b"connection: close" in answer.lower()


def test_interim_responses_are_not_passed_on(stack):
    response = stack.get("/early-hints", label=RAW)
    assert (response.status, response.read()) == (200, b"ok")


def test_a_kept_alive_connection_the_app_dropped_is_replaced_for_a_request_without_body(stack):
    connection = stack.connection()
    for _ in range(2):  # the second rides the kept connection, which the app then drops
        connection.request("GET", "/once", headers=stack.headers(RAW))
        assert connection.getresponse().read() == b"once"
    connection.request("POST", "/once", body=b"data", headers=stack.headers(RAW))
    response = connection.getresponse()  # a body may have had effects: never sent twice
    assert response.status == 502


def test_an_app_that_does_not_listen_or_speaks_garbage_gets_a_502_page(stack):
    for label, path in ((DOWN, "/"), (RAW, "/bad")):
        response = stack.get(path, label=label)
        assert response.status == 502
        assert b"did not answer" in response.read()


def test_an_endless_response_stops_when_the_viewer_leaves(stack):
    sock = stack.raw_socket()
    sock.sendall(b"GET /events HTTP/1.1\r\n" + stack.head_lines() + b"\r\n")
    assert b"data: tick" in sock.recv(65536)
    sock.close()
    assert stack.app.events_closed.wait(5)


def test_a_viewer_that_does_not_read_holds_the_app_back(stack):
    sock = stack.raw_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
    sock.sendall(b"GET /big HTTP/1.1\r\n" + stack.head_lines() + b"\r\n")
    assert sock.recv(100).startswith(b"HTTP/1.1 200")
    time.sleep(1.5)
    held_at = stack.app.big_written
    assert held_at < 40 * 1024 * 1024  # socket buffers, not the proxy's memory
    received = 100
    while received < 200 * 1024 * 1024:
        received += len(sock.recv(1024 * 1024))
    assert stack.app.big_written == 200 * 1024 * 1024


def test_pipelined_requests_are_answered_in_order(stack):
    sock = stack.raw_socket()
    request = b"GET /%s HTTP/1.1\r\n" + stack.head_lines() + b"\r\n"
    sock.sendall(request % b"small" + request % b"echo" + request % b"small")
    answer = b""
    while answer.count(b"HTTP/1.1 200") < 3 or not answer.endswith(b"abc"):
        answer += sock.recv(65536)
    assert answer.index(b"abc") < answer.index(b'"method"') < answer.rindex(b"abc")


def test_a_malformed_request_gets_400_and_headers_too_large_get_431(stack):
    sock = stack.raw_socket()
    sock.sendall(b"GET / HTTP/1.1\r\nHost wapp.localhost\r\n\r\n")
    assert read_until_closed(sock).startswith(b"HTTP/1.1 400 Bad Request")
    sock = stack.raw_socket()
    sock.sendall(b"GET / HTTP/1.1\r\n" + stack.head_lines(**{"X-Big": "a" * 70_000}) + b"\r\n")
    assert read_until_closed(sock).startswith(b"HTTP/1.1 431")


def test_any_host_but_an_apps_gets_a_plain_404(stack):
    for host in (
        f"localhost:{PORTS.WEBAPP_PROXY}",
        f"127.0.0.1:{PORTS.WEBAPP_PROXY}",
        "quor.example",
        "a.b.localhost",
    ):
        connection = stack.connection()
        connection.request("GET", "/", headers={"Host": host})
        response = connection.getresponse()
        assert (response.status, response.read()) == (404, b"Not found.\n"), host


def test_an_apps_host_without_the_viewer_cookie_is_sent_to_log_in(stack):
    connection = stack.connection()
    connection.request(
        "GET", "/small?x=1", headers={"Host": f"wapp.localhost:{PORTS.WEBAPP_PROXY}"}
    )
    response = connection.getresponse()
    assert response.status == 302
    assert response.getheader("Location") == services.login_url(APP, "/small?x=1")
    assert stack.app.received == []


def test_a_websocket_becomes_a_tunnel_to_the_app_unless_a_foreign_page_opens_it(stack):
    import websocket

    url = f"ws://127.0.0.1:{stack.port}/ws"
    headers = stack.headers()
    ws = websocket.create_connection(
        url, host=headers["Host"], cookie=headers["Cookie"], origin="null", timeout=10
    )
    for text in ("one", "two" * 30_000):
        ws.send(text)
        assert ws.recv() == f"echo: {text}"
    ws.close()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            url, host=headers["Host"], cookie=headers["Cookie"], origin="https://evil.example"
        )
    assert refused.value.status_code == 403


def test_an_idle_viewer_connection_is_closed(stack, monkeypatch):
    monkeypatch.setattr(proxy_module, "VIEWER_IDLE_SECONDS", 0.3)
    sock = stack.raw_socket()
    sock.sendall(b"GET /small HTTP/1.1\r\n" + stack.head_lines() + b"\r\n")
    started = time.monotonic()
    assert read_until_closed(sock).endswith(b"abc")
    assert time.monotonic() - started < 5


def test_only_signed_viewer_cookies_are_cached(monkeypatch):
    proxy = WebAppProxy()
    good = f"{services.VIEWER_COOKIE}={services.viewer_cookie(7, 'wabc')}"
    assert proxy.viewer(f"{services.VIEWER_COOKIE}=forged", "wabc") is None
    assert proxy.viewer(good, "wabcd") is None  # another app's host
    assert proxy._viewers == {}
    assert proxy.viewer(good, "wabc") == 7
    checks = []
    monkeypatch.setattr(proxy_module, "_viewer_id", lambda *args: checks.append(args))
    assert proxy.viewer(good, "wabc") == 7
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


def test_an_app_of_a_sleeping_sandbox_says_it_is_waking_and_reloads_itself(stack):
    response = stack.get("/", label=ASLEEP)
    assert response.status == 503
    assert response.getheader("Refresh") == str(gate.WAKING_RETRY_SECONDS)
    assert response.getheader("Retry-After") == str(gate.WAKING_RETRY_SECONDS)
    assert b"waking up" in response.read()


def test_a_viewer_cannot_smuggle_a_request_by_naming_the_framing_in_connection(stack):
    sock = stack.raw_socket()
    smuggled = b"GET /echo?smuggled=1 HTTP/1.1\r\nHost: x\r\nX-Evil: 1\r\n\r\n"
    sock.sendall(
        b"POST /upload HTTP/1.1\r\n"
        + stack.head_lines(**{"Content-Length": str(len(smuggled)), "Connection": "content-length"})
        + b"\r\n"
        + smuggled
    )
    answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")
    assert f'"received": {len(smuggled)}'.encode() in answer  # the bytes were the body
    assert not any("X-Evil" in request.headers for request in stack.app.received)
    other = stack.get("/echo")  # the next viewer on the kept connection gets its own answer
    assert json.loads(other.read())["method"] == "GET"


def test_a_failing_access_check_gets_a_503_not_silence(stack, monkeypatch):
    async def broken(user_id, label):
        raise RuntimeError("the database is down")

    monkeypatch.setattr(stack.proxy, "access", broken)
    stack.proxy._access.clear()
    response = stack.get("/small")
    assert response.status == 503
    assert b"cannot check access" in response.read()
