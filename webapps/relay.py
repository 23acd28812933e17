"""The web app proxy's end of local relay tunnels: a relayed connection is a byte stream
over the channel layer to the consumer holding the tunnel (webapps/consumers.py), which
passes it on to the `quor tunnel` client, which connects to its loopback port.

A stream looks like a socket's transport to the proxy's AppConnection, so a tunnel's
requests and WebSocket upgrades go through the very relay code web apps use (header
removal, framing, the sandbox CSP); only the connection differs. One stream carries one
request (or one WebSocket), never a kept-alive second one, so the client checks each
request's target before it connects.

Messages on the channel layer: `tunnel.open` (with the proxy's `reply` channel),
`tunnel.opened` (the consumer's acknowledgement), `tunnel.data` and `tunnel.close`, each
naming its `stream`. Redis pub/sub keeps one
sender's messages in order; a lost one shows as a stream that does not answer."""

import asyncio
import logging
import secrets
from typing import NamedTuple

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

# Bytes per message: a bigger write goes as several.
CHUNK_BYTES = 64 * 1024
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

    # --- the transport's interface, for AppConnection and ViewerConnection --------------------

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        for start in range(0, len(data), CHUNK_BYTES):
            self.send({"type": "tunnel.data", "data": bytes(data[start : start + CHUNK_BYTES])})

    def close(self) -> None:
        if self.closing:
            return
        self.send({"type": "tunnel.close"})
        self.closing = True
        self.relay.streams.pop(self.id, None)
        asyncio.get_running_loop().call_soon(self.lose, None)

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        """Not passed on: a tunnel's HTTP bodies are bounded (QUOR_TUNNEL_MAX_BODY_BYTES);
        its WebSocket frames are not yet (docs/decisions.md)."""

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return default

    # --- from the relay ------------------------------------------------------------------------

    def acknowledged(self) -> None:
        self.waiting.cancel()
        self.waiting = asyncio.get_running_loop().call_later(ANSWER_SECONDS, self.close)

    def received(self, data: bytes) -> None:
        self.waiting.cancel()
        if not self.lost:
            self.protocol.data_received(data)

    def ended(self) -> None:
        self.closing = True
        self.relay.streams.pop(self.id, None)
        self.lose(None)

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
