"""The web app proxy's end of local relay tunnels: a relayed connection is a byte stream
over the channel layer to the consumer holding the tunnel (webapps/consumers.py), which
passes it on to the `quor tunnel` client, which connects to its loopback port.

A stream looks like a socket's transport to the proxy's AppConnection, so a tunnel's
requests and WebSocket upgrades go through the very relay code web apps use (header
removal, framing, the sandbox CSP); only the connection differs. One stream carries one
request (or one WebSocket), never a kept-alive second one, so the client checks each
request's target before it connects.

Messages on the channel layer: `tunnel.open` (with the proxy's `reply` channel),
`tunnel.opened` (the consumer's acknowledgement), `tunnel.data`, `tunnel.ack` (`bytes`
written) and `tunnel.close` (optionally with a `reason`), each naming its `stream`. Redis
pub/sub keeps one sender's messages in order; a lost one shows as a stream that does not
answer.

Flow control is by credit, the same each way: the sender of a stream's `tunnel.data`
never has more than WINDOW_BYTES of it unacknowledged, and stops reading its source
while it has; the receiver acknowledges (`tunnel.ack`) what it has written to its own
socket, ACK_BYTES at a time. So nothing between the two ends (this process, Redis, the
web process, the client's WebSocket) holds more than a window of a stream each way.

- The proxy, sending (the viewer's bytes): what goes past the window waits here; on a
  WebSocket AppConnection is told `pause_writing` (it stops reading the viewer) until
  the client's acknowledgements make room again. A request's body was read whole (and
  bounded) before it is written, so there is no reading to stop.
- The proxy, receiving (the local server's bytes): they are written to the viewer as
  they come and acknowledged once written; while the viewer's socket is full
  (`pause_reading`, as of any transport) they wait here and nothing is acknowledged.
  A client that sends past its window is cut off (`tunnels.window_exceeded`): the
  client is the user's own program, so the proxy does not trust it to keep to it.
- The consumer counts what the client sent and the proxy has not acknowledged, and
  closes a stream past the window before it reaches Redis; it passes acknowledgements
  on (`a` frames to and from the client).
- The client reads its local connection only while it has credit, and acknowledges
  what it has written to the local server once its socket took it (`drain`).

A WebSocket (a stream after the local server's 101) is closed, both sides, once either
way passes QUOR_TUNNEL_WEBSOCKET_MAX_BYTES (`tunnels.websocket_too_large`); a request's
bodies are bounded by QUOR_TUNNEL_MAX_BODY_BYTES in proxy.py."""

import asyncio
import logging
import secrets
from typing import NamedTuple

from channels.layers import get_channel_layer
from django.conf import settings

logger = logging.getLogger(__name__)

# Bytes per message: a bigger write goes as several.
CHUNK_BYTES = 64 * 1024
# Bytes of a stream a sender may have sent, each way, that the receiver has not yet
# acknowledged. 1 MiB keeps a fast stream going across a round trip of some 10 ms at
# 100 MB/s, and bounds what a stream holds in every process it crosses.
WINDOW_BYTES = 1024 * 1024
# A receiver acknowledges once this much is written (never more than the window, or a
# sender would wait forever): one `tunnel.ack` per 4 `tunnel.data`.
ACK_BYTES = WINDOW_BYTES // 4
# A stream that its consumer does not acknowledge this soon is closed (the viewer gets
# 502): the web process holding the tunnel died, and its heartbeat has not lapsed yet.
ACK_SECONDS = 5
# Nor one whose client says nothing for this long after that: the client or the local
# server is gone or stuck.
ANSWER_SECONDS = 60


class TunnelAddress(NamedTuple):
    """Where the proxy "connects" for a tunnel: its consumer's channel, and the port
    the client relays to (the Host header the local server sees)."""

    channel: str
    port: int


class Relay:
    """The proxy process's one channel, on which every stream's answers arrive."""

    def __init__(self):
        self.layer = None
        self.channel = None
        self.streams: dict[str, Stream] = {}
        self.receiving = None

    async def connect(self, protocol_factory, address: TunnelAddress):
        if self.channel is None:
            self.layer = get_channel_layer()
            self.channel = await self.layer.new_channel()  # subscribed from here
            self.receiving = asyncio.ensure_future(self.receive())
        stream = Stream(self, secrets.token_hex(8), address.channel)
        self.streams[stream.id] = stream
        stream.send({"type": "tunnel.open", "reply": self.channel})
        stream.protocol = protocol_factory()
        stream.protocol.connection_made(stream)
        return stream.protocol

    async def receive(self):
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis: the streams that wait time out
                logger.exception("web app proxy: could not receive from relay tunnels")
                await asyncio.sleep(1)
                continue
            stream = self.streams.get(message.get("stream"))
            if stream is None:
                continue
            if message["type"] == "tunnel.opened":
                stream.acknowledged()
            elif message["type"] == "tunnel.data":
                stream.received(message["data"])
            elif message["type"] == "tunnel.ack":
                stream.credited(message["bytes"])
            elif message["type"] == "tunnel.close":
                stream.ended()


class Stream:
    """One relayed connection, as its AppConnection sees it: a transport."""

    def __init__(self, relay: Relay, stream_id: str, channel: str):
        self.relay = relay
        self.id = stream_id
        self.channel = channel
        self.protocol = None
        self.outgoing: list[dict] = []
        self.sender = None
        self.closing = False
        self.lost = False
        self.waiting = asyncio.get_running_loop().call_later(ACK_SECONDS, self.close)
        # Sending: bytes sent and not acknowledged, bytes waiting for room in the window,
        # and whether AppConnection was told to stop writing.
        self.unacknowledged = 0
        self.over_window = bytearray()
        self.writing_paused = False
        # Receiving: bytes written to the protocol and not acknowledged yet, bytes held
        # while it does not read, and whether it does not.
        self.unread = 0
        self.to_acknowledge = 0
        self.held: list[bytes] = []
        self.reading_paused = False
        # Each way, for the WebSocket's bound (counted from the stream's first byte).
        self.bytes_sent = 0
        self.bytes_received = 0

    # --- the transport's interface, for AppConnection and ViewerConnection --------------------

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        self.bytes_sent += len(data)
        if self.websocket_too_large(self.bytes_sent):
            return
        self.over_window += data
        self.send_within_window()
        # A request was read whole and bounded before it is written: only a WebSocket's
        # viewer is left unread (a paused viewer whose response ended would stay so).
        if self.over_window and not self.writing_paused and self.websocket():
            self.writing_paused = True
            self.protocol.pause_writing()

    def close(self, reason: str = "") -> None:
        if self.closing:
            return
        self.send({"type": "tunnel.close", **({"reason": reason} if reason else {})})
        self.closing = True
        self.held = []
        self.over_window = bytearray()
        self.relay.streams.pop(self.id, None)
        asyncio.get_running_loop().call_soon(self.lose, None)

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        """What the client sends meanwhile is held, and not acknowledged: it stops at
        the window."""
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False
        while self.held and not self.reading_paused and not self.lost:
            self.deliver(self.held.pop(0))

    def get_extra_info(self, name, default=None):
        return default

    # --- from the relay ------------------------------------------------------------------------

    def acknowledged(self) -> None:
        self.waiting.cancel()
        self.waiting = asyncio.get_running_loop().call_later(ANSWER_SECONDS, self.close)

    def received(self, data: bytes) -> None:
        self.waiting.cancel()
        if self.lost or self.closing:
            return
        self.bytes_received += len(data)
        self.unread += len(data)
        if self.unread > WINDOW_BYTES:
            logger.warning("web app proxy: a tunnel's client sent past its window; closed")
            return self.close("window_exceeded")
        if self.websocket_too_large(self.bytes_received):
            return
        if self.reading_paused:
            self.held.append(data)
        else:
            self.deliver(data)

    def credited(self, count) -> None:
        """The client wrote `count` more bytes to the local server."""
        if self.closing or not isinstance(count, int) or count < 0:
            return
        self.unacknowledged = max(0, self.unacknowledged - count)
        self.send_within_window()
        if self.writing_paused and not self.over_window:
            self.writing_paused = False
            self.protocol.resume_writing()

    def ended(self) -> None:
        self.closing = True
        self.relay.streams.pop(self.id, None)
        self.lose(None)

    # --- flow control ---------------------------------------------------------------------------

    def send_within_window(self) -> None:
        while self.over_window and self.unacknowledged < WINDOW_BYTES:
            room = min(CHUNK_BYTES, WINDOW_BYTES - self.unacknowledged)
            data = bytes(self.over_window[:room])
            del self.over_window[:room]
            self.unacknowledged += len(data)
            self.send({"type": "tunnel.data", "data": data})

    def deliver(self, data: bytes) -> None:
        """Written to the viewer (its transport buffers at most its high-water mark
        before it pauses this one), so acknowledged."""
        self.protocol.data_received(data)
        self.unread -= len(data)
        self.to_acknowledge += len(data)
        if self.to_acknowledge >= ACK_BYTES and not self.closing:
            self.send({"type": "tunnel.ack", "bytes": self.to_acknowledge})
            self.to_acknowledge = 0

    def websocket(self) -> bool:
        """Whether the local server's 101 made this stream a WebSocket's bytes."""
        return getattr(self.protocol, "tunnel", False)

    def websocket_too_large(self, count: int) -> bool:
        """After the local server's 101, either way past the bound closes the stream."""
        if not self.websocket():
            return False  # a request: its bodies are bounded in proxy.py
        if count <= settings.QUOR_TUNNEL_WEBSOCKET_MAX_BYTES:
            return False
        logger.info(
            "web app proxy: a tunnel's WebSocket passed QUOR_TUNNEL_WEBSOCKET_MAX_BYTES; closed"
        )
        self.close("websocket_too_large")
        return True

    # --- sending, in order -----------------------------------------------------------------

    def send(self, message: dict) -> None:
        message["stream"] = self.id
        self.outgoing.append(message)
        if self.sender is None:
            self.sender = asyncio.ensure_future(self.flush())

    async def flush(self) -> None:
        try:
            while self.outgoing:
                await self.relay.layer.send(self.channel, self.outgoing.pop(0))
        except Exception as error:  # Redis: the viewer learns the app did not answer
            logger.warning("web app proxy: could not relay to a tunnel (%s)", error)
            self.outgoing = []
            self.closing = True
            self.relay.streams.pop(self.id, None)
            self.lose(error)
        finally:
            self.sender = None

    def lose(self, error) -> None:
        if not self.lost:
            self.lost = True
            self.waiting.cancel()
            self.protocol.connection_lost(error)
