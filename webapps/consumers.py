"""A local relay tunnel's client connection: /ws/tunnels/?port=PORT, authenticated by a
personal API token (`Authorization: Bearer`), never by a browser's session cookie.

The consumer opens the tunnel (webapps/tunnels.py), tells the client its URL, keeps its
route alive while connected, and passes the web app proxy's streams (webapps/relay.py)
on to the client as binary frames: one byte for the kind (`o` open, `d` data, `a`
acknowledged, `c` close), the stream's 16 characters, then the data (for `a` the count of
bytes in ASCII digits, for `c` a reason or nothing). Refusals and the end come as a text
frame (`{"error": code, "message": ...}` or `{"closed": reason}`) before the close, as
Daphne drops a close frame's reason.

Flow control (webapps/relay.py): acknowledgements pass through both ways, and a stream
whose client sends more than a window the proxy has not acknowledged is closed here,
before its bytes reach the channel layer. A client that does not say it keeps to the
window (`protocol=2`) is refused: it would stall at the first window."""

import asyncio
import json
import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from quor import services as quor_services
from quor.lib.authentication import operator_token_matches
from quor.lib.errors import QuorError
from quor.lib.permissions import Permission
from webapps import tunnels
from webapps.relay import WINDOW_BYTES

logger = logging.getLogger(__name__)

CLOSE_ENDED = 4000
CLOSE_INVALID = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY = 4429
STREAM_ID_CHARS = 16
# The client's `protocol` query parameter: 2 acknowledges and keeps to the window.
PROTOCOL = "2"


@database_sync_to_async
def _user_for(authorization: str):
    keyword, _, raw_token = authorization.partition(" ")
    if keyword != "Bearer" or not raw_token.strip():
        return None
    return quor_services.api_token_authenticate(raw_token=raw_token.strip())


_open = database_sync_to_async(tunnels.tunnel_open)
_heartbeat = database_sync_to_async(tunnels.tunnel_heartbeat)
_close = database_sync_to_async(tunnels.tunnel_close)


class TunnelConsumer(AsyncWebsocketConsumer):
    required_permission = Permission.SANDBOX_USE
    # Browsers' session cookies open no tunnel (tests/quor/test_permission_table_websocket.py).
    token_only = True

    async def connect(self):
        self.tunnel = None
        self.end_reason = "disconnected"
        self.streams: dict[str, str] = {}  # stream id: the proxy channel it answers on
        self.in_flight: dict[str, int] = {}  # stream id: sent by the client, not acknowledged
        headers = dict(self.scope["headers"])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if not authorization:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        user = await _user_for(authorization)
        if user is None:
            message = "The API token is unknown or revoked."
            return await self.refuse(CLOSE_UNAUTHENTICATED, "tunnels.unauthenticated", message)
        operator_token = headers.get(b"x-quor-operator-token", b"").decode("latin-1")
        if settings.QUOR_TUNNEL_REQUIRE_OPERATOR_TOKEN and not operator_token_matches(
            operator_token
        ):
            message = "This deployment requires the operator token to open a tunnel."
            return await self.refuse(CLOSE_FORBIDDEN, "tunnels.operator_token_required", message)
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        port = query.get("port", [""])[0]
        if query.get("protocol", [""])[0] != PROTOCOL:
            message = "This quor client is too old for this deployment: upgrade it."
            return await self.refuse(CLOSE_INVALID, "tunnels.client_outdated", message)
        try:
            port = int(port) if port.isascii() and port.isdigit() else None
            self.tunnel = await _open(user=user, port=port, channel=self.channel_name)
        except QuorError as error:
            code = {401: CLOSE_UNAUTHENTICATED, 403: CLOSE_FORBIDDEN, 429: CLOSE_TOO_MANY}
            return await self.refuse(code.get(error.status, CLOSE_INVALID), error.code, str(error))
        await self.accept()
        opened = {
            "url": tunnels.tunnel_url(self.tunnel),
            "id": str(self.tunnel.pk),
            "expires_at": self.tunnel.expires_at.isoformat(),
            "window": WINDOW_BYTES,
        }
        await self.send(text_data=json.dumps(opened))
        self.keeping = asyncio.create_task(self.keep())

    async def refuse(self, code: int, error_code: str, message: str):
        await self.accept()
        await self.send(text_data=json.dumps({"error": error_code, "message": message}))
        await self.close(code=code)

    async def keep(self):
        """Renews the route every few seconds; ends the tunnel at its TTL, or when its
        route is gone (closed through the API, or by the beat)."""
        ttl_left = (self.tunnel.expires_at - timezone.now()).total_seconds()
        deadline = asyncio.get_running_loop().time() + ttl_left
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return await self.end("expired")
            await asyncio.sleep(min(tunnels.HEARTBEAT_SECONDS, left))
            expired = asyncio.get_running_loop().time() >= deadline
            if not expired and not await _heartbeat(self.tunnel):
                return await self.end("closed")

    async def end(self, reason: str):
        self.end_reason = reason
        await self.send(text_data=json.dumps({"closed": reason}))
        await self.close(code=CLOSE_ENDED)

    async def disconnect(self, code):
        if getattr(self, "keeping", None) is not None:
            self.keeping.cancel()
        for stream, reply in self.streams.items():
            await self.channel_layer.send(reply, {"type": "tunnel.close", "stream": stream})
        self.streams = {}
        self.in_flight = {}
        if self.tunnel is not None:
            await _close(tunnel=self.tunnel, reason=self.end_reason)

    # --- from the client -------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        if not bytes_data or len(bytes_data) < 1 + STREAM_ID_CHARS:
            return
        kind = bytes_data[:1]
        stream = bytes_data[1 : 1 + STREAM_ID_CHARS].decode("latin-1")
        reply = self.streams.get(stream)
        if reply is None:
            return
        data = bytes_data[1 + STREAM_ID_CHARS :]
        if kind == b"d":
            self.in_flight[stream] += len(data)
            if self.in_flight[stream] > WINDOW_BYTES:
                logger.warning("tunnel: a client sent past its window; the stream is closed")
                return await self.close_stream(stream, "window_exceeded")
            await self.channel_layer.send(
                reply, {"type": "tunnel.data", "stream": stream, "data": data}
            )
        elif kind == b"a" and data.isdigit() and len(data) <= 10:
            acknowledged = {"type": "tunnel.ack", "stream": stream, "bytes": int(data)}
            await self.channel_layer.send(reply, acknowledged)
        elif kind == b"c":
            del self.streams[stream]
            self.in_flight.pop(stream, None)
            await self.channel_layer.send(reply, {"type": "tunnel.close", "stream": stream})

    async def close_stream(self, stream: str, reason: str):
        """Ended here, both ways: the proxy and the client are told why."""
        reply = self.streams.pop(stream)
        self.in_flight.pop(stream, None)
        closed = {"type": "tunnel.close", "stream": stream, "reason": reason}
        await self.channel_layer.send(reply, closed)
        await self.send(bytes_data=b"c" + stream.encode() + reason.encode())

    # --- from the web app proxy (webapps/relay.py) -----------------------------------------

    async def tunnel_open(self, message):
        self.streams[message["stream"]] = message["reply"]
        self.in_flight[message["stream"]] = 0
        await self.send(bytes_data=b"o" + message["stream"].encode())
        opened = {"type": "tunnel.opened", "stream": message["stream"]}
        await self.channel_layer.send(message["reply"], opened)

    async def tunnel_data(self, message):
        if message["stream"] in self.streams:
            await self.send(bytes_data=b"d" + message["stream"].encode() + message["data"])

    async def tunnel_ack(self, message):
        stream = message["stream"]
        if stream in self.streams:
            self.in_flight[stream] = max(0, self.in_flight[stream] - message["bytes"])
            await self.send(bytes_data=b"a" + stream.encode() + b"%d" % message["bytes"])

    async def tunnel_close(self, message):
        self.in_flight.pop(message["stream"], None)
        if self.streams.pop(message["stream"], None) is not None:
            reason = message.get("reason", "").encode()
            await self.send(bytes_data=b"c" + message["stream"].encode() + reason)

    async def tunnel_end(self, message):
        """Closed by its owner through the API."""
        await self.end(message["reason"])
