"""Local relay tunnels end to end: the real `quor tunnel PORT` client (`.venv/bin/quor`,
running this checkout's tools/quor-cli, not the copy installed in .venv) connected to Quor's real web process (`manage.py serve_web`, started here with the
tunnel settings each test needs), a real HTTP and WebSocket server on loopback behind
it, and viewers, colleagues and strangers asking the real web app proxy
(`manage.py run_webapp_proxy`) for the tunnel's URL."""

import asyncio
import contextlib
import http.client
import http.server
import json
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from aiohttp import ClientSession, WSMsgType
from aiohttp import web as aiohttp_web
from django.test import Client
from django.utils import timezone
from websockets.asyncio.client import connect as websocket_connect
from websockets.asyncio.server import serve as websocket_serve

from quor import services as quor_services
from tests.conftest import _start, _stop
from tests.docker_helpers import wait_for_http, wait_for_port
from tests.environment import PORTS, free_port
from webapps import tunnels
from webapps.models import Tunnel

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
QUOR_CLI = ROOT / ".venv" / "bin" / "quor"
# The client's code as checked out, ahead of the copy `tools/provision` installed.
CLIENT_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT / "tools" / "quor-cli"), os.environ.get("PYTHONPATH")])
    ),
}
MAX_BODY = 64 * 1024
OPERATOR_TOKEN = "operator-token-for-the-tunnel-tests-0123456789"
# A frame of /flood's, under 64 KiB so that its header is 4 bytes.
FLOOD_FRAME = 60000


def until(condition, *, seconds: float, what: str):
    """Polls `condition` until it returns something true, or fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


class LocalServer:
    """What a developer runs on their machine: HTTP (it records every request it gets)
    and a WebSocket echo at /echo, on 127.0.0.1, in a thread of its own."""

    def __init__(self):
        self.requests = []
        self.flooded = 0  # bytes /flood's sends have handed to the socket
        self.websockets_ended = 0
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        started.wait(10)

    def _run(self, started):
        asyncio.set_event_loop(self.loop)
        self.stopping = asyncio.Event()
        app = aiohttp_web.Application(client_max_size=8 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = aiohttp_web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = aiohttp_web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def handle(self, request):
        if request.path == "/echo":
            websocket = aiohttp_web.WebSocketResponse()
            await websocket.prepare(request)
            async for message in websocket:
                await websocket.send_str(f"echo: {message.data}")
            self.websockets_ended += 1
            return websocket
        if request.path == "/flood":  # sends as fast as its socket takes it
            websocket = aiohttp_web.WebSocketResponse()
            await websocket.prepare(request)
            chunk = b"f" * FLOOD_FRAME
            for _ in range(int(request.query["frames"])):
                await websocket.send_bytes(chunk)  # waits while the socket is full
                self.flooded += len(chunk)
            await websocket.receive()
            return websocket
        if request.path == "/sink":  # never reads what comes
            websocket = aiohttp_web.WebSocketResponse()
            await websocket.prepare(request)
            await self.stopping.wait()
            return websocket
        body = await request.read()
        self.requests.append(
            {"target": request.raw_path, "headers": dict(request.headers), "body": len(body)}
        )
        if request.path == "/large":
            return aiohttp_web.Response(body=b"x" * int(request.query["bytes"]))
        return aiohttp_web.json_response(
            {"hello": "from the local server", "target": request.raw_path, "body": len(body)}
        )

    def stop(self):
        self.loop.call_soon_threadsafe(self.stopping.set)
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def local_server():
    server = LocalServer()
    yield server
    server.stop()


class Web:
    """Quor's web process with the given tunnel settings, on a port of its own."""

    def __init__(self, process_env, **settings):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**process_env, **{name: str(value) for name, value in settings.items()}}
        self.start()

    def start(self):
        argv = [sys.executable, "manage.py", "serve_web"]
        argv += ["--bind", "127.0.0.1", "--port", str(self.port), "--processes", "1"]
        self.process = _start(argv, self.env, f"tunnel-web-{self.port}")
        wait_for_http(f"{self.url}/healthz")

    def kill(self):
        """As a crash: no disconnect reaches anything."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self):
        _stop(self.process)


DEFAULTS = {
    "QUOR_TUNNELS_MAX": 2,
    "QUOR_TUNNELS_PER_USER": 1,
    "QUOR_TUNNEL_TTL_SECONDS": 600,
}


@pytest.fixture(scope="module")
def web(process_env):
    """Quor with tunnels on: 2 in all, 1 per user."""
    started = Web(process_env, **DEFAULTS)
    yield started
    started.stop()


@pytest.fixture
def web_with(process_env):
    started = []

    def start(**settings):
        started.append(Web(process_env, **{**DEFAULTS, **settings}))
        return started[-1]

    yield start
    for each in started:
        each.stop()


def start_proxy(process_env, **settings):
    """The web app proxy, with tunnels' bodies bounded at MAX_BODY and the given
    settings: its process, and (host, port)."""
    port = free_port()
    env = {**process_env, "QUOR_TUNNEL_MAX_BODY_BYTES": str(MAX_BODY)}
    env.update({name: str(value) for name, value in settings.items()})
    argv = [sys.executable, "manage.py", "run_webapp_proxy", "--bind", f"127.0.0.1:{port}"]
    process = _start(argv, env, f"tunnel-proxy-{port}")
    wait_for_port("127.0.0.1", port)
    return process, ("127.0.0.1", port)


@pytest.fixture(scope="module")
def proxy(process_env):
    """The web app proxy: (host, port)."""
    process, address = start_proxy(process_env)
    yield address
    _stop(process)


@pytest.fixture
def proxy_with(process_env):
    """Starts a web app proxy of the test's own: (process, (host, port))."""
    started = []

    def start(**settings):
        started.append(start_proxy(process_env, **settings))
        return started[-1]

    yield start
    for process, _ in started:
        _stop(process)


@pytest.fixture(autouse=True)
def no_tunnel_left_open(db):
    """The web processes outlive a test; its tunnels do not."""
    yield
    for tunnel in Tunnel.objects.filter(closed_at=None):
        tunnels.tunnel_close(tunnel=tunnel, reason="test ended")


def token_of(user) -> str:
    return quor_services.api_token_create(user=user, name="tunnel")[1]


class TunnelClient:
    """A running `quor tunnel PORT`."""

    def __init__(self, web, port, token, **env):
        self.process = subprocess.Popen(
            [str(QUOR_CLI), "tunnel", str(port), "--url", web.url],
            env={**CLIENT_ENV, "QUOR_TOKEN": token, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = None
        line = self.read_line(30)
        if line.startswith("Forwarding "):
            self.url = line.split()[1]

    def read_line(self, seconds: float) -> str:
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(seconds):
                return ""
        return self.process.stdout.readline()

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def label(self) -> str:
        return self.host.split(".")[0]

    def exited(self, seconds: float = 15) -> tuple[int, str, str]:
        stdout, stderr = self.process.communicate(timeout=seconds)
        return self.process.returncode, stdout, stderr

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


@pytest.fixture
def open_tunnel():
    clients = []

    def start(web, port, token, **env):
        clients.append(TunnelClient(web, port, token, **env))
        return clients[-1]

    yield start
    for each in clients:
        each.stop()


def fetch(proxy, host, target="/", *, method="GET", headers=None, body=None):
    connection = http.client.HTTPConnection(*proxy, timeout=40)
    connection.request(method, target, body=body, headers={"Host": host, **(headers or {})})
    response = connection.getresponse()
    response.body = response.read()
    connection.close()
    return response


def cookie_for(proxy, user, client) -> str | None:
    """The tunnel's viewer cookie, got as a browser gets it (Quor's hand-off), or None
    when Quor refuses the user."""
    browser = Client()
    browser.force_login(user)
    handoff = browser.get(f"/webapps/{client.label}/open")
    if handoff.status_code == 404:
        return None
    assert handoff.status_code == 302, handoff.status_code
    target = urlsplit(handoff["Location"])
    assert target.netloc == client.host
    response = fetch(proxy, client.host, f"{target.path}?{target.query}")
    assert response.status == 302
    return response.getheader("Set-Cookie").split(";")[0]


def raw(proxy, data: bytes) -> bytes:
    """Sends bytes as they are; what the proxy answers before it closes."""
    with socket.create_connection(proxy, timeout=20) as connection:
        connection.sendall(data)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := connection.recv(65536):
                answer += chunk
        return answer


def api(web, token, method, path, body=None):
    connection = http.client.HTTPConnection("127.0.0.1", web.port, timeout=20)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection.request(method, path, body=json.dumps(body) if body else None, headers=headers)
    response = connection.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else None


def test_the_creator_gets_the_local_servers_answer_through_the_tunnels_url(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))
    assert client.url.startswith("http://t") and client.label.startswith("t")
    assert len(client.label) == 33 and client.host.endswith(f".localhost:{PORTS.WEBAPP_PROXY}")
    cookie = cookie_for(proxy, owner, client)

    response = fetch(
        proxy,
        client.host,
        "/hello?x=1",
        headers={"Cookie": cookie, "Authorization": "Bearer viewer-secret"},
    )

    assert response.status == 200, response.body
    assert json.loads(response.body)["hello"] == "from the local server"
    seen = local_server.requests[-1]
    assert seen["target"] == "/hello?x=1"
    assert seen["headers"]["Host"] == f"localhost:{local_server.port}"
    assert "Cookie" not in seen["headers"] and "Authorization" not in seen["headers"]


def test_without_the_viewer_cookie_the_tunnel_sends_to_quors_login_and_nothing_reaches_the_port(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))

    response = fetch(proxy, client.host, "/private")

    assert response.status == 302
    assert response.getheader("Location").startswith(f"http://127.0.0.1:{PORTS.WEB}/webapps/t")
    assert local_server.requests == []


def test_a_colleague_is_refused_until_the_tunnel_is_shared_and_another_organization_never(
    web, proxy, owner, colleague, stranger, local_server, open_tunnel
):
    token = token_of(owner)
    client = open_tunnel(web, local_server.port, token)
    assert cookie_for(proxy, colleague, client) is None
    assert cookie_for(proxy, stranger, client) is None

    status, page = api(web, token, "GET", "/api/v1/tunnels/")
    listed = page["results"]
    assert status == 200 and [each["url"] for each in listed] == [client.url]
    status, shared = api(
        web, token, "PATCH", f"/api/v1/tunnels/{listed[0]['id']}/", {"sharing": "organization"}
    )
    assert status == 200 and shared["sharing"] == "organization"

    cookie = cookie_for(proxy, colleague, client)
    assert fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 200
    assert cookie_for(proxy, stranger, client) is None
    status, _ = api(web, token_of(colleague), "PATCH", f"/api/v1/tunnels/{listed[0]['id']}/")
    assert status == 404


def test_a_second_tunnel_over_the_per_user_count_and_one_over_the_global_count_are_refused(
    web, proxy, owner, colleague, stranger, local_server, open_tunnel
):
    assert open_tunnel(web, local_server.port, token_of(owner)).url

    second = open_tunnel(web, local_server.port, token_of(owner))
    code, _, stderr = second.exited()
    assert second.url is None and code != 0 and "tunnels.too_many_for_user" in stderr

    assert open_tunnel(web, local_server.port, token_of(colleague)).url
    third = open_tunnel(web, local_server.port, token_of(stranger))
    code, _, stderr = third.exited()
    assert third.url is None and code != 0 and "tunnels.too_many)" in stderr
    assert Tunnel.objects.filter(closed_at=None).count() == 2


def test_an_unknown_token_is_refused_with_a_clear_message(web, local_server, open_tunnel):
    client = open_tunnel(web, local_server.port, "not-a-token")

    code, _, stderr = client.exited()

    assert client.url is None and code != 0
    assert "The API token is unknown or revoked. (tunnels.unauthenticated)" in stderr


def test_bodies_over_the_bound_are_refused_with_413_and_never_reach_the_local_server(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)
    head = f"POST /upload HTTP/1.1\r\nHost: {client.host}\r\nCookie: {cookie}\r\n"

    declared = raw(proxy, f"{head}Content-Length: {MAX_BODY + 1}\r\n\r\n".encode())
    chunk = b"y" * 4096
    chunked = raw(
        proxy,
        f"{head}Transfer-Encoding: chunked\r\n\r\n".encode()
        + (b"%x\r\n%b\r\n" % (len(chunk), chunk)) * (MAX_BODY // 4096 + 1)
        + b"0\r\n\r\n",
    )

    assert declared.startswith(b"HTTP/1.1 413 ")
    assert chunked.startswith(b"HTTP/1.1 413 ")
    assert local_server.requests == []
    within = fetch(proxy, client.host, "/upload", method="POST", headers={"Cookie": cookie},
                   body=b"z" * MAX_BODY)  # fmt: skip
    assert within.status == 200 and json.loads(within.body)["body"] == MAX_BODY


def test_a_response_body_over_the_bound_is_cut_short(web, proxy, owner, local_server, open_tunnel):
    client = open_tunnel(web, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)

    fits = fetch(proxy, client.host, f"/large?bytes={MAX_BODY}", headers={"Cookie": cookie})
    assert fits.status == 200 and len(fits.body) == MAX_BODY
    with pytest.raises(http.client.IncompleteRead):
        fetch(proxy, client.host, f"/large?bytes={MAX_BODY + 1}", headers={"Cookie": cookie})


def test_an_absolute_form_target_is_refused_and_the_local_server_never_sees_it(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)

    for target in (
        f"http://127.0.0.1:{local_server.port}/admin",
        f"127.0.0.1:{local_server.port}",
        "*",
        "//elsewhere.example/",
    ):
        answer = raw(
            proxy,
            f"GET {target} HTTP/1.1\r\nHost: {client.host}\r\nCookie: {cookie}\r\n\r\n".encode(),
        )
        assert answer.startswith(b"HTTP/1.1 400 "), (target, answer[:100])
    assert local_server.requests == []


def test_a_host_pointing_elsewhere_still_reaches_only_the_clients_loopback_port(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)

    response = fetch(
        proxy,
        client.host,
        "/where",
        headers={"Cookie": cookie, "X-Forwarded-Host": "internal.example", "Forwarded": "host=x"},
    )

    assert response.status == 200
    assert local_server.requests[-1]["headers"]["Host"] == f"localhost:{local_server.port}"


def relay_to_the_client(port: int, streams: dict[bytes, list[bytes]]) -> dict[bytes, bytes]:
    """Runs the real client against a stand-in for Quor that sends it, on each stream,
    the given data frames (whatever the real proxy would or would not send), and returns
    what the client answered on each once all have ended."""
    answers = {stream: b"" for stream in streams}
    closed = set()

    async def quor(websocket):
        opened = {"url": "http://tx.test/", "expires_at": "soon", "window": 1024 * 1024}
        await websocket.send(json.dumps(opened))
        for stream, frames in streams.items():
            await websocket.send(b"o" + stream)
            for data in frames:
                await websocket.send(b"d" + stream + data)
        while len(closed) < len(streams):
            frame = await websocket.recv()
            stream = frame[1:17]
            if frame[:1] == b"d":
                answers[stream] += frame[17:]
            elif frame[:1] == b"c":
                closed.add(stream)
        await websocket.send(json.dumps({"closed": "test"}))

    async def run():
        async with websocket_serve(quor, "127.0.0.1", 0) as server:
            relay = server.sockets[0].getsockname()[1]
            process = await asyncio.create_subprocess_exec(
                str(QUOR_CLI), "tunnel", str(port), "--url", f"http://127.0.0.1:{relay}",
                env={**CLIENT_ENV, "QUOR_TOKEN": "t"},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.wait_for(process.wait(), 20)

    asyncio.run(run())
    return answers


def test_the_client_relays_only_origin_form_requests_and_only_to_its_loopback_port(
    local_server,
):
    """The client on its own, sent what the proxy never would: absolute and authority
    targets (answered 400, nothing connected) and a Host naming another listener
    (relayed to the client's port all the same)."""
    elsewhere = socket.create_server(("127.0.0.1", 0))
    elsewhere.settimeout(0.5)
    other = elsewhere.getsockname()[1]

    answers = relay_to_the_client(
        local_server.port,
        {
            b"a" * 16: [f"GET http://127.0.0.1:{other}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()],
            b"b" * 16: [f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\nHost: x\r\n\r\n".encode()],
            b"c" * 16: [f"GET /fine HTTP/1.1\r\nHost: 127.0.0.1:{other}\r\n\r\n".encode()],
        },
    )

    assert answers[b"a" * 16].startswith(b"HTTP/1.1 400 ")
    assert answers[b"b" * 16].startswith(b"HTTP/1.1 400 ")
    assert answers[b"c" * 16].startswith(b"HTTP/1.1 200 ")
    assert [each["target"] for each in local_server.requests] == ["/fine"]
    with pytest.raises(TimeoutError):
        elsewhere.accept()
    elsewhere.close()


def test_nothing_after_a_requests_end_reaches_the_local_port_whatever_the_relay_sends(
    local_server,
):
    """A second request on a stream, after a body of its declared length or after the
    last chunk, however the bytes are split into frames: the local server gets each
    stream's first request only, with its body, and never the absolute-form one."""
    smuggled = (
        b"GET http://127.0.0.1:1/admin HTTP/1.1\r\nHost: x\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"
    )
    posted = b"POST /posted HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" + smuggled
    chunked = (
        b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n" + smuggled
    )
    answers = relay_to_the_client(
        local_server.port,
        {
            b"a" * 16: [b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n" + smuggled],
            b"b" * 16: [posted[i : i + 7] for i in range(0, len(posted), 7)],
            b"c" * 16: [chunked[i : i + 5] for i in range(0, len(chunked), 5)],
        },
    )

    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers.values()), answers
    assert sorted((each["target"], each["body"]) for each in local_server.requests) == [
        ("/chunked", 7),
        ("/first", 0),
        ("/posted", 5),
    ]


def test_a_malformed_or_ambiguous_request_is_answered_400_and_never_reaches_the_local_port(
    local_server,
):
    heads = [
        b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"GET /x HTTP/1.1\r\nBad Header: 1\r\n\r\n",
        b"GET /x HTTP/1.1\r\n folded: 1\r\n\r\n",
        b"GET /x\x00y HTTP/1.1\r\n\r\n",
        b"GET /x HTTP/2.0\r\n\r\n",
    ]
    streams = {b"%016d" % index: [head] for index, head in enumerate(heads)}

    answers = relay_to_the_client(local_server.port, streams)

    assert all(answer.startswith(b"HTTP/1.1 400 ") for answer in answers.values()), answers
    assert local_server.requests == []


class BodyIgnoringServer:
    """A development server as many are: Python's http.server speaking HTTP/1.1, which
    answers without reading the request's body and keeps the connection for the next
    request. It records every request line it parses."""

    def __init__(self):
        self.lines = []
        self.connections_ended = threading.Semaphore(0)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self):
                server.lines.append(self.requestline)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = answer

            def finish(self):
                super().finish()
                server.connections_ended.release()

            def log_message(self, *args):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self):
        self.http.shutdown()
        self.http.server_close()


def test_a_body_that_looks_like_a_request_reaches_the_local_server_only_as_a_body(
    web, proxy, owner, open_tunnel
):
    """From outside: a viewer's POST whose body is an absolute-form request. The local
    server never reads the body, so before the client framed requests itself it took the
    body for the connection's next request."""
    local = BodyIgnoringServer()
    try:
        client = open_tunnel(web, local.port, token_of(owner))
        cookie = cookie_for(proxy, owner, client)
        body = f"GET http://127.0.0.1:{PORTS.WEB}/admin/ HTTP/1.1\r\nHost: x\r\n\r\n"

        response = fetch(
            proxy, client.host, "/form", method="POST", body=body, headers={"Cookie": cookie}
        )

        assert response.status == 200 and response.body == b"ok"
        assert local.connections_ended.acquire(timeout=20), "the local connection never ended"
        assert local.lines == ["POST /form HTTP/1.1"]
    finally:
        local.stop()


def test_the_tunnel_ends_at_its_ttl_and_its_route_with_it(
    web_with, proxy, owner, local_server, open_tunnel
):
    short = web_with(QUOR_TUNNEL_TTL_SECONDS=4)
    client = open_tunnel(short, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)
    assert fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 200

    code, stdout, _ = client.exited(seconds=20)

    assert code == 0 and "The tunnel ended (expired)." in stdout
    until(
        lambda: fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 404,
        seconds=10,
        what="the route is gone",
    )
    assert Tunnel.objects.get(label=client.label).close_reason == "expired"


def test_killing_the_client_removes_the_route_within_seconds(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)
    assert fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 200

    client.process.kill()

    until(
        lambda: fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 404,
        seconds=10,
        what="the route is gone",
    )
    tunnel = Tunnel.objects.get(label=client.label)
    assert tunnel.closed_at is not None and tunnel.close_reason == "disconnected"


def test_killing_the_web_process_removes_the_route_and_a_restart_brings_it_not_back(
    web_with, proxy, owner, local_server, open_tunnel
):
    crashing = web_with()
    token = token_of(owner)
    client = open_tunnel(crashing, local_server.port, token)
    cookie = cookie_for(proxy, owner, client)
    assert fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 200

    crashing.kill()

    until(
        lambda: fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 404,
        seconds=tunnels.HEARTBEAT_TTL_SECONDS + 8,
        what="the route is gone",
    )
    code, _, stderr = client.exited()
    assert code != 0 and "lost" in stderr
    crashing.start()
    assert fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 404
    # The beat closes the row; a new tunnel of the same user fits the count of 1 again.
    assert tunnels.tunnels_close_lost() == 1
    assert Tunnel.objects.get(label=client.label).close_reason == "lost"
    assert open_tunnel(crashing, local_server.port, token).url


def test_closing_the_tunnel_through_the_api_ends_the_client_and_the_route(
    web, proxy, owner, local_server, open_tunnel
):
    token = token_of(owner)
    client = open_tunnel(web, local_server.port, token)
    cookie = cookie_for(proxy, owner, client)
    tunnel = Tunnel.objects.get(label=client.label)

    status, _ = api(web, token, "DELETE", f"/api/v1/tunnels/{tunnel.pk}/")

    assert status == 204
    code, stdout, _ = client.exited()
    assert code == 0 and "The tunnel ended (closed)." in stdout
    until(
        lambda: fetch(proxy, client.host, "/", headers={"Cookie": cookie}).status == 404,
        seconds=10,
        what="the route is gone",
    )


def test_with_the_operator_token_required_a_client_without_it_is_refused_and_with_it_accepted(
    web_with, owner, local_server, open_tunnel
):
    strict = web_with(QUOR_TUNNEL_REQUIRE_OPERATOR_TOKEN="true", QUOR_OPERATOR_TOKEN=OPERATOR_TOKEN)
    token = token_of(owner)

    without = open_tunnel(strict, local_server.port, token)
    code, _, stderr = without.exited()
    assert without.url is None and code != 0 and "tunnels.operator_token_required" in stderr
    wrong = open_tunnel(strict, local_server.port, token, QUOR_OPERATOR_TOKEN="x" * 40)
    assert wrong.url is None and wrong.exited()[0] != 0

    assert open_tunnel(strict, local_server.port, token, QUOR_OPERATOR_TOKEN=OPERATOR_TOKEN).url


def echo_through(proxy, user, client, talk):
    """Runs `talk(websocket)` on a WebSocket to the local server's /echo through the
    tunnel, as `user`; returns what it returns."""
    cookie = cookie_for(proxy, user, client)

    async def connect_and_talk():
        async with (
            ClientSession() as session,
            session.ws_connect(
                f"http://{proxy[0]}:{proxy[1]}/echo",
                headers={"Host": client.host, "Cookie": cookie},
            ) as websocket,
        ):
            return await talk(websocket)

    return asyncio.run(connect_and_talk())


def test_a_websocket_goes_through_the_tunnel_both_ways(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))

    async def talk(websocket):
        replies = []
        for text in ("one", "two" * 30000):
            await websocket.send_str(text)
            replies.append((await websocket.receive(timeout=20)).data)
        return replies

    assert echo_through(proxy, owner, client, talk) == ["echo: one", "echo: " + "two" * 30000]


def test_the_client_is_a_package_of_its_own_that_needs_only_websockets(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT / "tools" / "quor-cli")],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("quor_cli-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt")))

    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist")] == [
        "Requires-Dist: websockets>=13"
    ]
    assert b"quor = quor_cli.main:main" in entry_points
    assert not any(name.startswith(("quor/", "webapps/", "sandboxes/")) for name in names)


def test_two_openings_at_once_cannot_both_take_the_last_place(owner, colleague, settings):
    settings.QUOR_TUNNELS_MAX = 1
    ready = threading.Barrier(2)
    outcomes = []

    def open_one(user):
        from django.db import connection

        ready.wait()
        try:
            tunnels.tunnel_open(user=user, port=8000, channel="test")
            outcomes.append("opened")
        except tunnels.TooManyTunnels:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=open_one, args=(user,)) for user in (owner, colleague)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(outcomes) == ["opened", "refused"]
    assert Tunnel.objects.filter(closed_at=None).count() == 1


def test_a_websocket_through_the_tunnel_closes_when_its_client_goes(
    web, proxy, owner, local_server, open_tunnel
):
    client = open_tunnel(web, local_server.port, token_of(owner))

    async def talk(websocket):
        await websocket.send_str("before")
        assert (await websocket.receive(timeout=20)).data == "echo: before"
        client.process.kill()
        return (await websocket.receive(timeout=20)).type

    closed = echo_through(proxy, owner, client, talk)
    assert closed in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR)


def test_the_beat_deletes_the_rows_of_tunnels_closed_more_than_a_week_ago(owner, org):
    from webapps.tasks import close_lost_tunnels

    now = timezone.now()

    def closed_tunnel(days_ago):
        return Tunnel.objects.create(
            owner=owner,
            organization=org,
            port=8000,
            expires_at=now - timedelta(days=days_ago),
            closed_at=now - timedelta(days=days_ago),
            close_reason="closed",
        )

    closed_tunnel(8)
    recently = closed_tunnel(6)

    close_lost_tunnels()

    assert list(Tunnel.objects.values_list("pk", flat=True)) == [recently.pk]


# --- flow control and the WebSocket bound -------------------------------------------------------


def rss(pid: int) -> int:
    """A process's resident memory, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
        * 1024
    )


def settled(read, *, seconds: float, what: str, still: float = 1.0):
    """Polls `read` until its value has not changed for `still` seconds; returns it."""
    last, since = read(), time.monotonic()
    deadline = since + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
        if value != last:
            last, since = value, time.monotonic()
        elif time.monotonic() - since >= still:
            return value
    raise AssertionError(f"not within {seconds} s: {what}")


def viewer_websocket(proxy, host: str, cookie: str, path: str) -> socket.socket:
    """A viewer's WebSocket on a plain socket with small buffers; only the 101's head is
    read, so everything after it stays unread until the test reads it."""
    viewer = socket.socket()
    viewer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    viewer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    viewer.settimeout(20)
    viewer.connect(proxy)
    viewer.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += viewer.recv(1)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return viewer


FLOOD_FRAMES = 1200  # 72 MB: more than every socket buffer on the way could hold


def test_a_local_websocket_faster_than_its_viewer_waits_for_it_and_quor_holds_no_more_than_a_window(
    web, proxy_with, owner, local_server, open_tunnel
):
    """The local server sends as fast as it can, the viewer reads nothing: the proxy
    (and the client) keep at most a window of it, and the local server waits. Before
    flow control the proxy buffered all of it for the viewer."""
    process, proxy = proxy_with()
    client = open_tunnel(web, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)
    before = {"proxy": rss(process.pid), "client": rss(client.process.pid)}
    viewer = viewer_websocket(proxy, client.host, cookie, f"/flood?frames={FLOOD_FRAMES}")

    flooded = settled(
        lambda: local_server.flooded, seconds=60, what="the local server's sending stopped"
    )

    total = FLOOD_FRAME * FLOOD_FRAMES
    grew = {"proxy": rss(process.pid) - before["proxy"]}
    grew["client"] = rss(client.process.pid) - before["client"]
    assert flooded < total / 2, flooded
    assert grew["proxy"] < 16 * 1024**2 and grew["client"] < 16 * 1024**2, grew
    # Read, the rest comes, whole and in order.
    expected, got = total + 4 * FLOOD_FRAMES, 0
    while got < expected:
        data = viewer.recv(1024 * 1024)
        assert data, f"closed after {got} of {expected} bytes"
        got += len(data)
    assert got == expected and local_server.flooded == total
    viewer.close()


def test_a_viewer_faster_than_the_local_server_reads_waits_and_quor_holds_no_more_than_a_window(
    web, proxy_with, owner, local_server, open_tunnel
):
    """The other way: the viewer sends as fast as it can, the local server reads
    nothing. Before flow control the client buffered all of it for the local server."""
    process, proxy = proxy_with()
    client = open_tunnel(web, local_server.port, token_of(owner))
    cookie = cookie_for(proxy, owner, client)
    before = {"proxy": rss(process.pid), "client": rss(client.process.pid)}
    viewer = viewer_websocket(proxy, client.host, cookie, "/sink")
    payload = b"s" * FLOOD_FRAME
    # A binary frame, masked (as a client's are) with a key of zeros.
    frame = b"\x82\xfe" + len(payload).to_bytes(2, "big") + b"\0\0\0\0" + payload
    total = len(frame) * FLOOD_FRAMES

    viewer.setblocking(False)
    sent = 0
    with selectors.DefaultSelector() as selector:
        selector.register(viewer, selectors.EVENT_WRITE)
        # Sends until the socket has taken no byte for 2 s (or all of it).
        while sent < total and selector.select(2):
            with contextlib.suppress(BlockingIOError):
                sent += viewer.send(frame[sent % len(frame) :])

    grew = {"proxy": rss(process.pid) - before["proxy"]}
    grew["client"] = rss(client.process.pid) - before["client"]
    assert sent < total / 2, sent
    assert grew["proxy"] < 16 * 1024**2 and grew["client"] < 16 * 1024**2, grew
    viewer.close()


def test_a_body_of_several_windows_goes_through_and_its_connection_serves_the_next_request(
    web, proxy_with, owner, local_server, open_tunnel
):
    """A guard of flow control, not a gap it closed: a request's body goes a window at a
    time, and the viewer's kept-alive connection is not left paused after it."""
    _, proxy = proxy_with(QUOR_TUNNEL_MAX_BODY_BYTES=4 * 1024**2)
    client = open_tunnel(web, local_server.port, token_of(owner))
    headers = {"Host": client.host, "Cookie": cookie_for(proxy, owner, client)}
    connection = http.client.HTTPConnection(*proxy, timeout=40)

    connection.request("POST", "/upload", body=b"b" * (3 * 1024**2), headers=headers)
    first = connection.getresponse()
    uploaded = json.loads(first.read())
    connection.request("GET", "/after", headers=headers)
    second = connection.getresponse()
    second.read()
    connection.close()

    assert first.status == 200 and uploaded["body"] == 3 * 1024**2
    assert second.status == 200


def test_a_websocket_past_its_bound_is_closed_to_the_viewer_and_the_local_server(
    web, proxy_with, owner, local_server, open_tunnel
):
    _, proxy = proxy_with(QUOR_TUNNEL_WEBSOCKET_MAX_BYTES=1024**2)
    client = open_tunnel(web, local_server.port, token_of(owner))
    message = "m" * (128 * 1024)

    async def talk(websocket):
        echoed = 0
        for _ in range(32):  # 4 MiB each way, four times the bound
            await websocket.send_str(message)
            reply = await websocket.receive(timeout=20)
            if reply.type != WSMsgType.TEXT:
                return echoed, reply.type
            echoed += len(reply.data)
        return echoed, None

    echoed, ended = echo_through(proxy, owner, client, talk)

    assert ended in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR), echoed
    assert echoed <= 1024**2
    until(lambda: local_server.websockets_ended, seconds=20, what="the local WebSocket closed")
    client.process.kill()
    assert "tunnels.websocket_too_large" in client.process.communicate()[1]


def test_a_client_that_sends_past_its_window_has_the_stream_cut_off(web, proxy_with, owner):
    """A modified client ignores the window and answers with more than Quor
    acknowledged: the stream is cut, the viewer sees an incomplete response, and the
    client is told why."""
    _, proxy = proxy_with(QUOR_TUNNEL_MAX_BODY_BYTES=8 * 1024**2)
    token, size = token_of(owner), 3 * 1024**2
    opened, closed = queue.Queue(), queue.Queue()

    async def greedy_client():
        async with websocket_connect(
            f"ws://127.0.0.1:{web.port}/ws/tunnels/?port=8000&protocol=2",
            additional_headers={"Authorization": f"Bearer {token}"},
            origin=f"http://127.0.0.1:{web.port}",
        ) as websocket:
            opened.put(json.loads(await websocket.recv()))
            async for frame in websocket:
                kind, stream = frame[:1], frame[1:17]
                if kind == b"o":  # answers at once, all of it, never waiting for credit
                    await websocket.send(
                        b"d%sHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (stream, size)
                    )
                    for _ in range(size // 65536):
                        await websocket.send(b"d" + stream + b"x" * 65536)
                elif kind == b"c":
                    return closed.put(frame[17:])

    threading.Thread(target=asyncio.run, args=(greedy_client(),), daemon=True).start()
    host = urlsplit(opened.get(timeout=30)["url"]).netloc
    tunnel = SimpleNamespace(host=host, label=host.split(".")[0])
    cookie = cookie_for(proxy, owner, tunnel)

    with pytest.raises((http.client.IncompleteRead, http.client.RemoteDisconnected)):
        fetch(proxy, host, "/", headers={"Cookie": cookie})
    assert closed.get(timeout=20) == b"window_exceeded"
