"""The web app proxy: serves `<label>.<app base host>` on its own port (`manage.py
run_webapp_proxy`), relaying HTTP/1.1 between viewers and the app servers in sandboxes.

It authenticates the viewer with the app's own cookie (set by the hand-off), checks the
session's sharing scope, and relays requests and responses as they arrive: no body is
buffered (a full socket buffer on one side stops reading the other), and a WebSocket
upgrade becomes a byte tunnel after the app's 101. The viewer's credentials and identity
never reach the app, and the app cannot set cookies (`webapps.headers`).

An asyncio protocol on httptools rather than an ASGI server and an HTTP client: a small
request costs a third of the CPU (docs/decisions.md, docs/performance.md)."""

import asyncio
import collections
import contextlib
import functools
import http
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

import httptools
import redis
import redis.asyncio
from channels.db import database_sync_to_async
from django.conf import settings

from quor.lib import metrics
from webapps import gate, link_codes, link_quotas, link_sign_in, pages, services, tunnels
from webapps import headers as header_rules
from webapps.link_bandwidth import LinkBandwidth
from webapps.relay import Relay, TunnelAddress

logger = logging.getLogger(__name__)

# How long a viewer's access check (and the app's address) is reused: each check costs
# a few milliseconds of database work, and a page loads dozens of files. Revoked access
# (sharing switched off, membership removed, sandbox stopped) takes effect within it.
# A verified viewer cookie (a signature check, about a fifth of a small request's CPU
# time) is reused as long, keyed by the whole Cookie header.
ACCESS_CACHE_SECONDS = 5.0
ACCESS_CACHE_ENTRIES = 10_000
CONNECT_TIMEOUT = 10
# A viewer connection with no request for this long is closed.
VIEWER_IDLE_SECONDS = 60
# Kept-alive connections to app servers: at most this many idle per app, each for this
# long (an app server holds a thread or a task for each).
UPSTREAM_IDLE_PER_APP = 32
UPSTREAM_IDLE_SECONDS = 30
# Request line and headers together; more gets 431.
MAX_HEAD_BYTES = 64 * 1024
# A Host header's value: a name or an IP literal, with an optional port (RFC 9110 7.2,
# narrowed to what browsers send); anything else gets 400, not a guess at the app meant.
HOST_SHAPE = re.compile(r"([a-z0-9._-]+|\[[0-9a-f:.]+\])(:[0-9]+)?", re.IGNORECASE)

NOT_FOUND = b"Not found.\n"
# Threads of a proxy process that send public links' codes by mail (SMTP blocks).
MAIL_THREADS = 2
REASONS = {status.value: status.phrase for status in http.HTTPStatus}
LAST_CHUNK = b"0\r\n\r\n"
# How a response body is framed: its own Content-Length (or none at all), re-chunked,
# or ended by closing the connection.
AS_IS, CHUNKED, UNTIL_CLOSE = "as-is", "chunked", "until-close"


@functools.cache
def _trusted_proxies() -> tuple[gate.Network, ...]:
    return gate.trusted_networks(settings.QUOR_WEBAPP_TRUSTED_PROXIES)


def _viewer_id(cookie_header: str, label: str) -> int | None:
    cookies = SimpleCookie()
    try:
        cookies.load(cookie_header)
    except Exception:
        return None
    morsel = cookies.get(services.VIEWER_COOKIE)
    return services.read_viewer_cookie(morsel.value, label) if morsel else None


@database_sync_to_async
def _webapp_for(user_id, label):
    from django.db import close_old_connections

    from quor.lib.errors import NotFound
    from quor.models import User

    close_old_connections()
    user = User.objects.select_related("membership__organization").filter(pk=user_id).first()
    if tunnels.is_tunnel_label(label):
        found = tunnels.tunnel_for_viewer(user, label)
        if found is None:
            return None, None, False
        tunnel, channel = found
        return tunnel, TunnelAddress(channel, tunnel.port), False
    try:
        webapp = services.get_webapp_for_viewer(user, label)
    except NotFound:
        return None, None, False
    waking = services.webapp_opened(webapp)
    return webapp, services.upstream_address(webapp), waking


@database_sync_to_async
def _link_for(label):
    """(link, upstream address, waking) if visitors may use the link now, else
    (None, None, False). Never cached: revocation, expiry, a confidential session and
    the organization's switch take effect at the next request."""
    from django.db import close_old_connections

    close_old_connections()
    link = services.public_link_for_visitor(label)
    if link is None:
        return None, None, False
    waking = services.webapp_opened(link.webapp)
    return link, services.upstream_address(link.webapp), waking


def _remember(cache: dict, key, value, now: float) -> None:
    """Caches `value` for ACCESS_CACHE_SECONDS; never more than ACCESS_CACHE_ENTRIES."""
    if len(cache) >= ACCESS_CACHE_ENTRIES:
        for old in [k for k, (expires, _) in cache.items() if expires <= now]:
            del cache[old]
        if len(cache) >= ACCESS_CACHE_ENTRIES:
            cache.clear()
    cache[key] = (now + ACCESS_CACHE_SECONDS, value)


def _head(first_line: str, headers) -> bytes:
    lines = [first_line, *(f"{name}: {value}" for name, value in headers), "", ""]
    return "\r\n".join(lines).encode("latin-1", "replace")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Request:
    """One viewer request, from its head to the end of the proxy's response."""

    __slots__ = (
        "app_framing", "chunked", "collect", "complete", "discard", "done",
        "expect_continue", "fields", "framing", "has_body", "head_bytes", "headers",
        "http11", "keep_alive", "method", "pending", "responded", "retried", "room",
        "sending", "set_cookie", "status", "target", "viewer", "websocket",
    )  # fmt: skip

    def __init__(self):
        self.method = ""
        self.target = ""
        self.headers = []
        self.http11 = True
        self.keep_alive = False
        self.websocket = False
        self.chunked = False
        self.has_body = False
        self.expect_continue = False
        self.framing = self.app_framing = AS_IS
        self.pending = []  # body chunks that arrived before the app's connection
        self.complete = False  # the whole body has been read from the viewer
        self.sending = False  # the head went to the app; body chunks follow directly
        self.responded = False
        self.done = False
        self.discard = False  # answered without the app: the rest of the body is dropped
        self.retried = False
        self.status = 0
        self.head_bytes = 0
        self.fields = {}
        self.viewer = None  # (user id, app label), once the viewer's cookie names them
        # (None, link label) for a public link's visitor.
        # The most body bytes read before it is served (a link's sign-in form, a
        # tunnel's request), or 0: relayed as it arrives.
        self.collect = 0
        self.room = None  # a tunnel's response: the body bytes it may still relay
        self.set_cookie = ""  # a link's visitor cookie, added to the app's response

    def header(self, name: str) -> str:
        return self.fields.get(name, "")

    def parsed(self, parser) -> None:
        self.fields = dict(reversed(self.headers))  # a repeated header: its first value
        self.method = parser.get_method().decode("latin-1")
        self.http11 = parser.get_http_version() == "1.1"
        self.keep_alive = parser.should_keep_alive()
        self.chunked = "chunked" in self.header("transfer-encoding").lower()
        self.has_body = self.chunked or bool(self.header("content-length").strip("0 "))
        self.expect_continue = self.header("expect").lower() == "100-continue"
        self.websocket = parser.should_upgrade() and self.header("upgrade").lower() == "websocket"
        if parser.should_upgrade():
            self.keep_alive = False  # the parser stops at an upgrade, whatever the answer

    def routable(self) -> bool:
        """Exactly one Host of a host's shape (RFC 9112 3.2), and a path for a target
        (origin-form): the app would take an absolute URL's host (RFC 9112 3.2.2) over
        the Host the proxy routed by and writes, and `host:port` (CONNECT) or `*` name
        no resource of it. Nor `//host` or `/\\host`: URL parsers (urlsplit, yarl, a
        browser following the app's redirect to it) read them as a host."""
        hosts = [value for name, value in self.headers if name == "host"]
        return (
            len(hosts) == 1
            and HOST_SHAPE.fullmatch(hosts[0].strip(" \t")) is not None
            and self.target.startswith("/")
            and self.target[1:2] not in ("/", "\\")
        )

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def head_for_app(self, port: int) -> bytes:
        headers = [
            (name, value)
            for name, value in header_rules.request_headers_to_forward(self.headers)
            # the proxy itself says 100 Continue to the viewer, and frames the body
            if name not in ("expect", "content-length")
        ]
        headers.append(("host", f"localhost:{port}"))
        if self.chunked:
            headers.append(("transfer-encoding", "chunked"))
        elif self.header("content-length"):  # a number: the parser refuses anything else
            headers.append(("content-length", self.header("content-length").strip()))
        if self.websocket:
            headers += [("connection", "upgrade"), ("upgrade", "websocket")]
        return _head(f"{self.method} {self.target} HTTP/1.1", headers)

    def body_for_app(self, data: bytes) -> bytes:
        return _chunk(data) if self.chunked else data


class WebAppProxy:
    """What all viewer connections of the process share: the access caches and the
    app servers' kept-alive connections."""

    def __init__(self, *, access_log: bool = False):
        self.access_log = access_log
        self._access: dict[tuple[int, str], tuple[float, tuple]] = {}
        self._viewers: dict[tuple[str, str], tuple[float, int]] = {}
        self._labels: dict[str, str | None] = {}
        self._idle: dict[tuple[str, int], list[tuple[float, AppConnection]]] = {}
        self._tunnels: dict[ViewerConnection, tuple[int | None, str]] = {}
        self._background: set[asyncio.Future] = set()
        self._tunnel_checks = None
        self._check_now = asyncio.Event()  # a public link ended: check tunnels at once
        self._link_checks_listener = None
        self._mail = ThreadPoolExecutor(MAIL_THREADS, thread_name_prefix="quor-link-mail")
        self.relay = Relay()

    def connection(self) -> "ViewerConnection":
        return ViewerConnection(self)

    def start(self) -> None:
        self._link_checks_listener = asyncio.ensure_future(self._listen_for_link_checks())

    async def _listen_for_link_checks(self) -> None:
        """Checks open WebSockets at once when Quor says a public link ended
        (services.links_check_now); the round every QUOR_WEBAPP_WEBSOCKET_CHECK_SECONDS
        catches the rest, and covers the time Redis is away."""
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2)
        while True:
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(services.links_check_channel())
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._check_now.set()
            except (redis.RedisError, OSError) as error:
                logger.warning("web app proxy: no word of ended links from Redis (%s)", error)
                await asyncio.sleep(1)

    def background(self, work, failure: str) -> None:
        """Runs `work` without a viewer waiting on it; a failure is logged."""
        task = asyncio.ensure_future(work)
        self._background.add(task)

        def done(task):
            self._background.discard(task)
            if not task.cancelled() and task.exception() is not None:
                logger.warning("web app proxy: %s (%s)", failure, task.exception())

        task.add_done_callback(done)

    async def code_send(self, link, email: str) -> None:
        """A new one-time code for this email link and address: kept in Redis (as an
        HMAC), then mailed from a thread of the proxy's own, as SMTP blocks."""
        code = link_codes.code_new()
        await link_codes.code_store(link.pk, email, link_codes.code_digest(link.pk, email, code))
        mail = functools.partial(services.public_link_code_mail, link=link, email=email, code=code)
        await asyncio.get_running_loop().run_in_executor(self._mail, mail)

    def send_code(self, link, email: str) -> None:
        self.background(self.code_send(link, email), "could not send a public link's code")

    def label(self, host: str) -> str | None:
        """The app label of a Host header (remembered: every request asks)."""
        if host not in self._labels:
            if len(self._labels) >= ACCESS_CACHE_ENTRIES:
                self._labels.clear()
            self._labels[host] = services.label_for_host(host)
        return self._labels[host]

    def viewer(self, cookie_header: str, label: str) -> int | None:
        """The viewer's user id from the app's cookie, or None."""
        now = time.monotonic()
        cached = self._viewers.get((cookie_header, label))
        if cached and cached[0] > now:
            return cached[1]
        user_id = _viewer_id(cookie_header, label)
        if user_id is not None:  # only signed cookies: nobody else fills the cache
            _remember(self._viewers, (cookie_header, label), user_id, now)
        return user_id

    def cached_access(self, user_id: int, label: str) -> tuple | None:
        cached = self._access.get((user_id, label))
        return cached[1] if cached and cached[0] > time.monotonic() else None

    async def access(self, user_id: int, label: str) -> tuple:
        """(web app, upstream address, waking) if the viewer may open it, else
        (None, None, False). Asking is activity on the app's sandbox, and wakes it."""
        found = self.cached_access(user_id, label)
        if found is None:
            found = await _webapp_for(user_id, label)
            if not tunnels.is_tunnel_label(label):  # a tunnel's route ends at once: asked anew
                _remember(self._access, (user_id, label), found, time.monotonic())
        return found

    def tunnel_opened(self, viewer: "ViewerConnection", user_id: int, label: str) -> None:
        """A WebSocket outlives the access check that opened it: its viewer's access is
        checked again every QUOR_WEBAPP_WEBSOCKET_CHECK_SECONDS (a public link's at once
        when it ends), and the tunnel closed when it is gone (sharing switched off, the
        viewer deactivated or removed, the link revoked)."""
        self._tunnels[viewer] = (user_id, label)
        if self._tunnel_checks is None:
            self._tunnel_checks = asyncio.ensure_future(self._check_tunnels())

    def tunnel_closed(self, viewer: "ViewerConnection") -> None:
        self._tunnels.pop(viewer, None)

    async def _check_tunnels(self) -> None:
        try:
            while self._tunnels:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._check_now.wait(), settings.QUOR_WEBAPP_WEBSOCKET_CHECK_SECONDS
                    )
                self._check_now.clear()
                for viewer, (user_id, label) in list(self._tunnels.items()):
                    try:
                        if user_id is None:  # a public link's visitor: the link, afresh
                            webapp = (await _link_for(label))[0]
                        else:
                            webapp = (await self.access(user_id, label))[0]
                    except Exception:  # the database: keep the tunnel, ask again later
                        logger.exception("web app proxy: could not check a tunnel's access")
                        continue
                    if webapp is None and viewer in self._tunnels:
                        logger.info("web app proxy: closing a tunnel whose access ended")
                        viewer.close()
        finally:
            self._tunnel_checks = None

    def idle_connection(self, address) -> "AppConnection | None":
        idle = self._idle.get(address)
        while idle:
            since, connection = idle.pop()
            if since > time.monotonic() - UPSTREAM_IDLE_SECONDS and not connection.closing():
                return connection
            connection.close()
        return None

    def keep_idle(self, connection: "AppConnection") -> None:
        idle = self._idle.setdefault(connection.address, [])
        # A tunnel's stream carries one request: its client checks each one's target.
        if len(idle) >= UPSTREAM_IDLE_PER_APP or isinstance(connection.address, TunnelAddress):
            connection.close()
        else:
            idle.append((time.monotonic(), connection))

    def forget_idle(self, connection: "AppConnection") -> None:
        idle = self._idle.get(connection.address, [])
        self._idle[connection.address] = [item for item in idle if item[1] is not connection]

    async def connect(self, address) -> "AppConnection":
        if isinstance(address, TunnelAddress):
            return await self.relay.connect(lambda: AppConnection(self, address), address)
        loop = asyncio.get_running_loop()
        _, connection = await asyncio.wait_for(
            loop.create_connection(lambda: AppConnection(self, address), *address),
            CONNECT_TIMEOUT,
        )
        return connection

    def close(self) -> None:
        if self._link_checks_listener is not None:
            self._link_checks_listener.cancel()
        self._mail.shutdown(wait=False)
        for idle in self._idle.values():
            for _, connection in idle:
                connection.close()
        self._idle.clear()


class AppConnection(asyncio.Protocol):
    """A connection to an app server, serving one viewer request at a time."""

    def __init__(self, proxy: WebAppProxy, address):
        self.proxy = proxy
        self.address = address
        self.viewer: ViewerConnection | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.headers = []
        self.reused = False
        self.tunnel = False
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        self.viewer = None
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data):
        if self.tunnel:
            if self.viewer is not None:
                self.viewer.write(data)
            return
        viewer = self.viewer
        if viewer is None:  # an idle connection has nothing to say
            self.close()
            return
        viewer.hold_writes()  # a small response (head, body, end) leaves in one send
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            viewer.write(data[upgrade.args[0] :])
        except httptools.HttpParserError:
            logger.warning("web app at %s:%s sent a malformed response", *self.address)
            self.viewer = None
            self.transport.close()
            viewer.app_lost(self)
        finally:
            viewer.release_writes()

    def connection_lost(self, exc):
        self.proxy.forget_idle(self)
        viewer, self.viewer = self.viewer, None
        if viewer is not None:
            viewer.app_lost(self)

    def pause_writing(self):
        if self.viewer is not None:
            self.viewer.pause("app-busy")

    def resume_writing(self):
        if self.viewer is not None:
            self.viewer.resume("app-busy")

    # httptools callbacks
    def on_message_begin(self):
        self.headers = []

    def on_header(self, name: bytes, value: bytes):
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self):
        if self.viewer is not None:
            self.viewer.response_head(self, self.parser.get_status_code(), self.headers)

    def on_body(self, body: bytes):
        if self.viewer is not None:
            self.viewer.response_body(body)

    def on_message_complete(self):
        if self.viewer is not None and not self.tunnel:
            self.viewer.response_end(self)


class ViewerConnection(asyncio.Protocol):
    """A viewer's connection: requests in order, each answered by the proxy itself
    (log in, hand-off, 404, 503) or relayed to the app."""

    def __init__(self, proxy: WebAppProxy):
        self.proxy = proxy
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        self.requests: collections.deque[Request] = collections.deque()  # [0] is served
        self.parsing: Request | None = None
        self.app: AppConnection | None = None  # the app's connection serving requests[0]
        self.tunnel = None  # after a WebSocket upgrade: the app's transport
        self.upgrade_requested = False  # the parser stopped: no more requests on it
        self.after_upgrade = b""  # what the viewer sent after its upgrade request
        self.read_pauses: set[str] = set()
        self.held: list[bytes] | None = None
        self.writing_paused = False
        self.closed = False
        self.task = None
        self.idle = None
        self.last_active = 0.0
        # A public link visitor's current request or WebSocket: its share of the link's
        # bandwidth, taken before it is written.
        self.bandwidth: LinkBandwidth | None = None
        self.finish_waiting = None  # (request, close) once the bandwidth's bytes are out

    # --- the viewer's socket --------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        loop = asyncio.get_running_loop()
        self.last_active = loop.time()
        self.idle = loop.call_later(VIEWER_IDLE_SECONDS, self.close_if_idle)

    def connection_lost(self, exc):
        self.closed = True
        self.bandwidth_release()
        self.proxy.tunnel_closed(self)
        if self.idle is not None:
            self.idle.cancel()
        if self.task is not None:
            self.task.cancel()
        if self.app is not None:  # an endless response ends with its viewer
            self.app.close()
            self.app = None

    def data_received(self, data):
        if self.tunnel is not None:
            self.tunnel.write(data)
            return
        if self.upgrade_requested:
            self.after_upgrade += data
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.upgrade_requested = True
            self.after_upgrade += data[upgrade.args[0] :]
        except httptools.HttpParserCallbackError as error:
            if isinstance(error.__context__, HeadTooLarge):
                self.refuse(431, "The request's headers are too large.", error)
            elif isinstance(error.__context__, NotRoutable):
                self.refuse(400, "Bad request.", error.__context__)
            else:
                raise
        except httptools.HttpParserError as error:
            self.refuse(400, "Bad request.", error)

    def pause_writing(self):
        self.writing_paused = True
        if self.app is not None:
            self.app.transport.pause_reading()

    def resume_writing(self):
        self.writing_paused = False
        if self.app is not None and not self.app.closing() and not self.bandwidth_waits():
            self.app.transport.resume_reading()

    def pause(self, reason: str) -> None:
        if not self.read_pauses and not self.closed:
            self.transport.pause_reading()
        self.read_pauses.add(reason)

    def resume(self, reason: str) -> None:
        self.read_pauses.discard(reason)
        if not self.read_pauses and not self.closed:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if self.bandwidth is not None and not self.bandwidth.admit(data):
            return  # sent once the link's bandwidth for it is taken
        if self.held is not None:
            self.held.append(data)
        else:
            self.send(data)

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    # --- a public link's bandwidth (webapps/link_bandwidth.py) -----------------------------

    def bandwidth_waits(self) -> bool:
        return self.bandwidth is not None and bool(self.bandwidth.waiting)

    def bandwidth_written(self) -> None:
        """What waited for the link's bandwidth is out: a response that ended meanwhile
        is finished now."""
        if self.finish_waiting is not None:
            request, close = self.finish_waiting
            self.finish_waiting = None
            self.finish(request, close=close)

    def bandwidth_spent(self, error, *, sent: bool) -> None:
        """The link's bandwidth ran out (or Redis could not say): before a response's
        first byte the visitor gets 429 (503) instead; after, it is cut short, as the
        visitor's client then shows."""
        self.finish_waiting = None
        if self.app is not None:
            self.app.close()
            self.app = None
        request = self.requests[0] if self.requests else None
        if request is None or sent or self.tunnel is not None:
            return self.close()
        self.bandwidth_release()
        if error is not None:
            message = "Quor cannot count what this link serves right now. Try again."
            return self.reply(request, 503, message, close=True)
        self.reply(request, 429, "This link has served all it may serve.", close=True)

    def bandwidth_release(self) -> None:
        if self.bandwidth is not None:
            self.bandwidth.release()
            self.bandwidth = None

    def upstream(self):
        """The transport the response's bytes come from: the app's, or its WebSocket's."""
        if self.tunnel is not None:
            return self.tunnel
        return self.app.transport if self.app is not None else None

    def hold_writes(self) -> None:
        self.held = []

    def release_writes(self) -> None:
        held, self.held = self.held, None
        if held:
            self.send(b"".join(held))  # counted already

    def close(self) -> None:
        if not self.closed:
            self.release_writes()
            self.closed = True
            self.transport.close()  # after what was written

    def close_if_idle(self):
        """One timer per connection, not one per request."""
        loop = asyncio.get_running_loop()
        idle_for = 0 if self.requests else loop.time() - self.last_active
        if idle_for >= VIEWER_IDLE_SECONDS:
            self.close()
        elif not self.closed:
            self.idle = loop.call_later(VIEWER_IDLE_SECONDS - idle_for, self.close_if_idle)

    def refuse(self, status: int, message: str, error) -> None:
        """A request the parser cannot read: answered (unless a response has begun),
        then the connection is closed."""
        logger.info("web app proxy: %s (%s)", message, error)
        request = self.requests[0] if self.requests else Request()
        if not request.responded:
            self.reply(request, status, message, close=True)
        self.close()

    # --- httptools callbacks (the viewer's requests) ----------------------------------------

    def on_message_begin(self):
        self.parsing = Request()

    def on_url(self, url: bytes):
        self.count(len(url))
        self.parsing.target += url.decode("latin-1")

    def on_header(self, name: bytes, value: bytes):
        self.count(len(name) + len(value))
        self.parsing.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def count(self, size: int) -> None:
        self.parsing.head_bytes += size
        if self.parsing.head_bytes > MAX_HEAD_BYTES:
            raise HeadTooLarge(self.parsing.head_bytes)

    def on_headers_complete(self):
        request = self.parsing
        request.parsed(self.parser)
        if not request.routable():  # raised: the parser stops, nothing goes to the app
            raise NotRoutable(f"{request.method} {request.target}")
        if self.parser.should_upgrade():
            self.pause("upgrade")  # until the app's 101 opens the tunnel, or the answer
        self.requests.append(request)
        if len(self.requests) == 1:
            self.serve(request)
        else:
            self.pause("pipelined")

    def on_body(self, body: bytes):
        request = self.parsing
        if request.discard:
            return
        if request.collect and sum(map(len, request.pending)) + len(body) > request.collect:
            request.collect = 0
            return self.reply(request, 413, "The request's body is too large.", close=True)
        if request.sending:
            self.app.transport.write(request.body_for_app(body))
        else:
            request.pending.append(body)

    def on_message_complete(self):
        request = self.parsing
        request.complete = True
        if request.collect:  # read whole: served now
            request.collect = 0
            return self.serve(request)
        if request.sending and request.chunked and not request.discard:
            self.app.transport.write(LAST_CHUNK)
        if request.done:
            self.next_request()

    # --- deciding: the request's facts go to the gate (webapps/gate.py), its answer is ---
    # --- carried out here --------------------------------------------------------------------

    def serve(self, request: Request) -> None:
        label = self.proxy.label(request.header("host"))
        link = label is not None and services.is_link_label(label)
        viewer = None
        if label is not None and not link:
            viewer = self.proxy.viewer(request.header("cookie"), label)
        facts = gate.RequestFacts(
            label=label,
            link=link,
            method=request.method,
            path=request.path,
            fetch_dest=request.header("sec-fetch-dest"),
            viewer=viewer,
            body_read=request.complete,
        )
        self.act(request, label, gate.route(facts))

    def act(self, request: Request, label: str | None, answer) -> None:
        match answer:
            case gate.Reply(plain=True):
                headers = [
                    ("content-type", "text/plain; charset=utf-8"),
                    ("content-length", str(len(NOT_FOUND))),
                ]
                self.respond(request, answer.status, headers, NOT_FOUND)
            case gate.Reply():
                self.reply(
                    request,
                    answer.status,
                    answer.message,
                    refresh=answer.refresh,
                    retry_after=answer.retry_after,
                    close=answer.close,
                )
            case gate.Redirect(to="viewer"):
                location = services.viewer_url(label, request.target)
                self.reply(request, 302, answer.message, location=location)
            case gate.Redirect(to="login"):
                location = services.login_url(label, request.target)
                self.reply(request, 302, answer.message, location=location)
            case gate.ReadBody():
                if answer.continue_first:
                    self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    request.expect_continue = False
                request.collect = answer.most  # on_message_complete serves it again
            case gate.HandOff():
                self.run(request, self.handoff(request, label))
            case gate.LookUpLink():
                self.run(request, self.serve_link(request, label))
            case gate.CheckAccess(user_id=user_id):
                request.viewer = (user_id, label)
                found = self.proxy.cached_access(user_id, label)
                if found is None:
                    self.run(request, self.check_access(request, user_id, label))
                else:
                    self.proceed(request, label, *found)
            case _:
                raise TypeError(f"not an answer of the gate's: {answer!r}")

    async def serve_link(self, request: Request, label: str):
        """A public link's visitor: the link must be usable now, within its quotas, and
        the visitor past its sign-in if it has one. Then relayed as a viewer's request
        is, with the same headers removed; the visitor's only cookie is the link's own."""
        link, address, waking = await _link_for(label)
        quota, retry_after = await link_quotas.request_take(link) if link else ("", 0)
        facts = gate.LinkFacts(
            found=link is not None,
            quota=quota,
            retry_after=retry_after,
            path=request.path,
            visitor_auth=link.visitor_auth if link else "",
            admitted=link is not None and self.link_visitor(request, link),
        )
        match gate.visit(facts):
            case gate.SignIn():
                attempt = link_sign_in.Attempt(
                    method=request.method,
                    path=request.path,
                    query=request.target.partition("?")[2],
                    form=b"".join(request.pending),
                    address=self.visitor_address(request),
                    user_agent=request.header("user-agent"),
                )
                request.pending = []
                answer = await link_sign_in.answer(link, attempt, self.proxy.send_code)
                self.signed_in(request, answer)
            case gate.SignInPage(step=step):
                self.signed_in(request, link_sign_in.Form(401, step, request.target))
            case gate.Admit(new_visitor=new_visitor):
                if new_visitor:
                    address_seen = self.visitor_address(request)
                    user_agent = request.header("user-agent")
                    await link_sign_in.visit_record(link, address_seen, user_agent, "")
                    request.set_cookie = services.link_visitor_cookie(link)
                request.viewer = (None, label)
                self.bandwidth = LinkBandwidth(self, link)
                self.proceed(request, label, link.webapp, address, waking)
            case answer:
                self.act(request, label, answer)

    def signed_in(self, request: Request, answer) -> None:
        """Carries out a sign-in's answer (webapps/link_sign_in.py)."""
        match answer:
            case link_sign_in.Form():
                headers, body = pages.sign_in_page(
                    answer.step, answer.next_path, error=answer.error, email=answer.email
                )
                self.respond(request, answer.status, headers, body)
            case link_sign_in.SignedIn():
                headers = [
                    ("location", answer.location),
                    ("set-cookie", answer.cookie),
                    ("cache-control", "no-store"),
                    ("content-length", "0"),
                ]
                self.respond(request, 303, headers, b"")
            case _:
                self.act(request, None, answer)

    def link_visitor(self, request: Request, link) -> bool:
        cookies = SimpleCookie()
        try:
            cookies.load(request.header("cookie"))
        except Exception:
            return False
        morsel = cookies.get(services.LINK_COOKIE)
        return morsel is not None and services.link_visitor_admitted(morsel.value, link)

    def visitor_address(self, request: Request) -> str:
        """The connection's address, or behind a trusted front proxy the visitor's it
        names (QUOR_WEBAPP_TRUSTED_PROXIES)."""
        peername = self.transport.get_extra_info("peername") if self.transport else None
        forwarded = [value for name, value in request.headers if name == "x-forwarded-for"]
        return gate.client_address(peername[0] if peername else "", forwarded, _trusted_proxies())

    async def check_access(self, request, user_id, label):
        self.proceed(request, label, *await self.proxy.access(user_id, label))

    def proceed(self, request: Request, label: str, webapp, address, waking) -> None:
        facts = gate.AppFacts(
            found=webapp is not None,
            running=address is not None,
            waking=waking,
            websocket=request.websocket,
            origin_allowed=not request.websocket or self.origin_allowed(request, label),
            tunnel=isinstance(address, TunnelAddress),
            max_body=settings.QUOR_TUNNEL_MAX_BODY_BYTES,
            content_length=request.header("content-length"),
            body_bytes=sum(map(len, request.pending)),  # what came with the head
            has_body=request.has_body,
            body_read=request.complete,
            expect_continue=request.expect_continue,
        )
        answer = gate.admit(facts)
        if not isinstance(answer, gate.Forward):
            return self.act(request, label, answer)
        request.room = answer.room
        app = None if request.websocket else self.proxy.idle_connection(address)
        if app is None:
            return self.run(request, self.connect_and_forward(request, address))
        app.reused = True
        self.forward(request, app)

    def origin_allowed(self, request: Request, label: str) -> bool:
        """The app's own origin, or "null": the preview iframe and the CSP sandbox give
        the app an opaque origin."""
        return request.header("origin") in ("", "null", services.app_origin().origin(label))

    async def connect_and_forward(self, request, address):
        self.forward(request, await self.proxy.connect(address))

    async def handoff(self, request, label):
        query = parse_qs(request.target.partition("?")[2])
        user_id = services.read_handoff(query.get("token", [""])[0], label)
        webapp = (await _webapp_for(user_id, label))[0] if user_id else None
        if webapp is None:
            return self.reply(request, 404, gate.NO_SUCH_APP)
        cookie = f"{services.VIEWER_COOKIE}={services.viewer_cookie(user_id, label)}; "
        cookie += services.viewer_cookie_attributes()
        headers = [
            ("location", services.safe_next(query.get("next", ["/"])[0])),
            ("set-cookie", cookie),
            ("cache-control", "no-store"),
            ("content-length", "0"),
            ("content-security-policy", header_rules.SANDBOX_CSP),
        ]
        self.respond(request, 302, headers, b"")

    def run(self, request: Request, decision) -> None:
        """Runs an asynchronous part of a decision (the database, a new connection);
        the viewer is not read meanwhile."""
        self.pause("deciding")

        async def deciding():
            try:
                await decision
            except (OSError, TimeoutError) as error:
                if not self.closed and not request.responded:
                    logger.info("web app proxy: the app did not answer (%s)", error)
                    self.reply(request, 502, "The app did not answer. It may have stopped.")
            except Exception:  # the database, most likely: say so, never leave it hanging
                logger.exception("web app proxy: could not decide on a request")
                if not self.closed and not request.responded:
                    message = "Quor cannot check access to this app right now. Try again."
                    self.reply(request, 503, message, close=True)
            finally:
                self.task = None
                self.resume("deciding")

        self.task = asyncio.ensure_future(deciding())

    # --- answering ---------------------------------------------------------------------------

    def reply(
        self,
        request,
        status: int,
        message: str,
        *,
        location=None,
        refresh=None,
        retry_after=None,
        close=False,
    ):
        headers, body = pages.page(status, message, location, refresh)
        if retry_after:
            headers.append(("retry-after", str(retry_after)))
        self.respond(request, status, headers, body, close=close)

    def respond(self, request: Request, status: int, headers, body: bytes, *, close=False):
        """A whole response from the proxy itself. An unread request body is dropped, or
        the connection closed if the viewer waits for 100 Continue."""
        close = close or (not request.complete and request.expect_continue)
        if close or not request.keep_alive:
            headers = [*headers, ("connection", "close")]
        request.responded = True
        request.status = status
        self.write(_head(f"HTTP/1.1 {status} {REASONS.get(status, '')}", headers) + body)
        self.finish(request, close=close)

    def forward(self, request: Request, app: AppConnection) -> None:
        if self.closed:
            app.close()
            return
        self.app = app
        app.viewer = self
        if self.writing_paused:
            app.transport.pause_reading()
        if request.expect_continue and not request.complete:
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        data = [request.head_for_app(app.address[1])]
        data += [request.body_for_app(chunk) for chunk in request.pending]
        if request.complete and request.chunked:
            data.append(LAST_CHUNK)
        request.pending = []
        request.sending = True
        app.transport.write(b"".join(data))

    def response_head(self, app: AppConnection, status: int, headers) -> None:
        request = self.requests[0]
        if status == 101 and request.websocket:
            return self.open_tunnel(request, app, headers)
        if status < 200:  # 100 Continue, 103 Early Hints: the final answer follows
            return
        request.app_framing = (
            AS_IS
            if any(name == "content-length" for name, _ in headers)
            else CHUNKED
            if any(name == "transfer-encoding" for name, _ in headers)
            else UNTIL_CLOSE
        )
        returned = header_rules.response_headers_to_return(headers)
        if request.set_cookie:  # after the app's own were removed: only the link's
            returned.append(("set-cookie", request.set_cookie))
        if request.method == "HEAD" or status in (204, 304) or request.app_framing == AS_IS:
            request.framing = AS_IS
        elif request.http11:
            request.framing = CHUNKED
            returned.append(("transfer-encoding", "chunked"))
        else:
            request.framing = UNTIL_CLOSE
            request.keep_alive = False
        if not request.keep_alive:
            returned.append(("connection", "close"))
        elif not request.http11:
            returned.append(("connection", "keep-alive"))
        request.responded = True
        request.status = status
        head = _head(f"HTTP/1.1 {status} {REASONS.get(status, '')}", returned)
        if self.bandwidth is not None and request.framing == AS_IS:
            self.bandwidth_expect(request, status, len(head), returned)
        self.write(head)
        if request.method == "HEAD":  # the parser would wait for a body that never comes
            self.response_end(app, reusable=False)

    def bandwidth_expect(self, request: Request, status: int, head: int, headers) -> None:
        length = dict(headers).get("content-length", "0").strip()
        has_body = request.method != "HEAD" and status not in (204, 304) and length.isdigit()
        self.bandwidth.expect(head + (int(length) if has_body else 0))

    def response_body(self, body: bytes) -> None:
        request = self.requests[0]
        if request.room is not None:
            request.room -= len(body)
            if request.room < 0:  # cut short: the viewer sees an incomplete response
                logger.info("web app proxy: a tunnel's response body is too large")
                return self.close()
        self.write(_chunk(body) if self.requests[0].framing == CHUNKED else body)

    def response_end(self, app: AppConnection, reusable: bool = True) -> None:
        request = self.requests[0]
        if not request.responded:  # the end of an interim (1xx) response
            return
        if request.framing == CHUNKED:
            self.write(LAST_CHUNK)
        self.app = None
        app.viewer = None
        if reusable and request.complete and app.parser.should_keep_alive():
            self.proxy.keep_idle(app)
        else:
            app.close()
        self.finish(request)

    def app_lost(self, app: AppConnection) -> None:
        """The app's connection closed (or sent garbage) before its response ended."""
        if app is not self.app:
            return
        self.app = None
        request = self.requests[0]
        if self.tunnel is not None:
            self.close()
        elif not request.responded:
            if app.reused and not request.has_body and not request.retried:
                request.retried = True  # it had closed while idle: once more, anew
                request.sending = False
                self.run(request, self.connect_and_forward(request, app.address))
            else:
                self.reply(request, 502, "The app did not answer. It may have stopped.")
        elif request.app_framing == UNTIL_CLOSE:
            if request.framing == CHUNKED:
                self.write(LAST_CHUNK)
            self.finish(request)
        else:  # cut short: the viewer must see an incomplete response, not a whole one
            self.close()

    def open_tunnel(self, request: Request, app: AppConnection, headers) -> None:
        returned = header_rules.response_headers_to_return(headers)
        returned += [("connection", "upgrade"), ("upgrade", "websocket")]
        request.responded = True
        request.status = 101
        self.write(_head("HTTP/1.1 101 Switching Protocols", returned))
        self.log(request)
        self.tunnel = app.transport
        app.tunnel = True
        self.proxy.tunnel_opened(self, *request.viewer)
        if self.after_upgrade:
            app.transport.write(self.after_upgrade)
            self.after_upgrade = b""
        self.resume("upgrade")

    def finish(self, request: Request, *, close: bool = False) -> None:
        if self.bandwidth_waits():  # its last bytes wait for the link's bandwidth
            self.finish_waiting = (request, close)
            return
        request.done = True
        self.log(request)
        if self.tunnel is None:
            self.bandwidth_release()
        if close or not request.keep_alive:
            self.close()
        elif request.complete:
            self.next_request()
        else:
            request.discard = True  # read the rest of its body, then the next request

    def next_request(self) -> None:
        self.requests.popleft()
        if len(self.requests) <= 1:
            self.resume("pipelined")
        if self.requests:
            self.serve(self.requests[0])
        else:
            self.last_active = asyncio.get_running_loop().time()

    def log(self, request: Request) -> None:
        """Every answered request is counted, and logged with --access-log."""
        metrics.webapp_request(request.status)
        if self.proxy.access_log:
            host = request.header("host")
            logger.info("%s %s %s %s", host, request.method, request.target, request.status)


class HeadTooLarge(Exception):
    pass


class NotRoutable(Exception):
    """A request the parser accepts but the proxy refuses (Request.routable)."""


async def serve(proxy: WebAppProxy, host: str, port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(proxy.connection, host, port, reuse_address=True, backlog=1024)
