"""`quor tunnel PORT`: relays a Quor URL to a server on 127.0.0.1:PORT.

The client connects out to Quor over a WebSocket with an API token (QUOR_TOKEN, from
the environment so that it stays out of `ps`), prints the URL Quor gives it, and relays
each request Quor's web app proxy sends to 127.0.0.1:PORT, and nowhere else. Each
relayed stream is one request (or one WebSocket), parsed and checked whole by the client
(RequestReader) whatever the relay sends: anything but an origin-form target (`/path`) is
answered 400 without connecting, and nothing after the request's end reaches the port.

Frames both ways (binary): one byte for the kind (`o` open, `d` data, `a` acknowledged,
`c` close), the stream's 16 characters, then the data (for `a` a count of bytes in ASCII
digits, for `c` Quor's reason or nothing); text frames say what Quor refused or why the
tunnel ended.

Flow control, by credit: the client never has more than the window Quor names (`window`)
of a stream's bytes sent and not acknowledged (`a`), and does not read the local
connection meanwhile; it acknowledges what Quor sent once the local server's socket took
it, a quarter of the window at a time. Quor cuts off a stream that passes its window."""

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
from urllib.parse import urlsplit

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

LOOPBACK = "127.0.0.1"
STREAM_ID_CHARS = 16
# A request's line and headers together; more is refused.
MAX_HEAD = 64 * 1024
# A chunk-size line (with its extensions); more is refused.
MAX_CHUNK_LINE = 1024
# What the relay may send after a WebSocket upgrade request before the local server
# answers it.
MAX_EARLY_BYTES = 64 * 1024
READ_BYTES = 64 * 1024
# What Quor's flow control expects of this client (`protocol` in the tunnel's address).
PROTOCOL = 2
UPGRADE_ACCEPTED = b"HTTP/1.1 101 "
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Headers about the connection or the body's framing: the client writes its own.
FRAMING_HEADERS = {
    b"connection", b"keep-alive", b"proxy-connection", b"host", b"transfer-encoding",
    b"content-length", b"upgrade", b"te", b"trailer",
}  # fmt: skip


def _plain(status: str, text: str) -> bytes:
    body = f"quor tunnel: {text}\n".encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


BAD_REQUEST = _plain("400 Bad Request", "only origin-form request targets are relayed")
BAD_GATEWAY = _plain("502 Bad Gateway", "nothing answers on the local port")


class Refused(Exception):
    """What the relay sent is not a request the client relays."""


def origin_form(request_line: bytes) -> bool:
    """`METHOD /path HTTP/1.x`: never an absolute URL, `host:port` or `*`, nor `//host`."""
    parts = request_line.split(b" ")
    return (
        len(parts) == 3
        and TOKEN.fullmatch(parts[0]) is not None
        and parts[1].startswith(b"/")
        and parts[1][1:2] not in (b"/", b"\\")
        and all(0x21 <= byte <= 0x7E for byte in parts[1])
        and parts[2] in (b"HTTP/1.1", b"HTTP/1.0")
    )


class RequestReader:
    """One request out of the bytes a stream brings, parsed and checked before any of it
    reaches the local port: the head is written anew (`Connection: close`, the client's
    own framing and Host), the body framed by its own length or chunks, and everything
    after the request's end dropped. So the local server gets one request a stream, and
    a body it leaves unread is never taken for another request: it closes the
    connection after its answer."""

    def __init__(self, port: int):
        self.port = port
        self.buffer = b""
        self.state = "head"
        self.left = 0  # of a Content-Length body or of the current chunk
        self.websocket = False
        self.early = b""  # after a WebSocket upgrade, until the local server agrees

    @property
    def started(self) -> bool:
        return self.state != "head"

    def feed(self, data: bytes) -> bytes:
        """The bytes to write to the local server now (Refused: write nothing more)."""
        self.buffer += data
        out = []
        while self.buffer and self.state not in ("done", "upgrading", "upgraded"):
            step = getattr(self, f"_{self.state}")()
            if step is None:
                break
            out.append(step)
        if self.state == "upgrading":
            self.early += self.buffer
            self.buffer = b""
            if len(self.early) > MAX_EARLY_BYTES:
                raise Refused("too much sent before the WebSocket was accepted")
        elif self.state == "upgraded":
            out.append(self.early + self.buffer)
            self.early = self.buffer = b""
        elif self.state == "done":
            self.buffer = b""  # never a second request
        return b"".join(out)

    def upgrade_answered(self, accepted: bool) -> bytes:
        """The local server's answer to a WebSocket upgrade: from a 101 on, the stream is
        the WebSocket's bytes; otherwise nothing more is relayed."""
        if self.state != "upgrading":
            return b""
        self.state = "upgraded" if accepted else "done"
        early, self.early = (self.early, b"") if accepted else (b"", b"")
        return early

    def _head(self) -> bytes | None:
        head, found, rest = self.buffer.partition(b"\r\n\r\n")
        if not found:
            if len(self.buffer) > MAX_HEAD:
                raise Refused("the request's head is too large")
            return None
        if len(head) > MAX_HEAD:
            raise Refused("the request's head is too large")
        line, *lines = head.split(b"\r\n")
        if not origin_form(line):
            raise Refused("not an origin-form request line")
        headers = []
        for each in lines:
            name, colon, value = each.partition(b":")
            if not colon or TOKEN.fullmatch(name) is None or b"\n" in each or b"\r" in each:
                raise Refused("a malformed header line")
            headers.append((name.lower(), value.strip(b" \t")))
        written = [line, *(b"%s: %s" % pair for pair in headers if pair[0] not in FRAMING_HEADERS)]
        written.append(b"Host: localhost:%d" % self.port)
        written += self._framing(line.split(b" ")[0], headers)
        self.buffer = rest
        return b"\r\n".join([*written, b"", b""])

    def _framing(self, method: bytes, headers) -> list[bytes]:
        values = {}
        for name, value in headers:
            values.setdefault(name, []).append(value)
        encodings = values.get(b"transfer-encoding", [])
        lengths = values.get(b"content-length", [])
        upgrade = b",".join(values.get(b"upgrade", [])).lower()
        if encodings and lengths:
            raise Refused("both Transfer-Encoding and Content-Length")
        if encodings:
            if [value.lower() for value in encodings] != [b"chunked"]:
                raise Refused("a Transfer-Encoding other than chunked")
            self.state = "chunk_size"
            return [b"Transfer-Encoding: chunked", b"Connection: close"]
        if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
            raise Refused("a Content-Length that is not one number")
        self.left = int(lengths[0]) if lengths else 0
        if method == b"GET" and upgrade == b"websocket" and not self.left:
            self.websocket = True
            self.state = "upgrading"
            return [b"Connection: Upgrade", b"Upgrade: websocket"]
        self.state = "body" if self.left else "done"
        return [b"Content-Length: %d" % self.left, b"Connection: close"]

    def _take(self) -> bytes:
        """What is buffered of the body's (or the chunk's) remaining bytes."""
        piece, self.buffer = self.buffer[: self.left], self.buffer[self.left :]
        self.left -= len(piece)
        return piece

    def _body(self) -> bytes:
        piece = self._take()
        if not self.left:
            self.state = "done"
        return piece

    def _chunk_size(self) -> bytes | None:
        line, found, rest = self.buffer.partition(b"\r\n")
        if not found:
            if len(self.buffer) > MAX_CHUNK_LINE:
                raise Refused("a chunk-size line too long")
            return None
        size = line.split(b";", 1)[0].strip(b" \t")
        if not size or len(size) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in size):
            raise Refused("a malformed chunk size")
        self.left = int(size, 16)
        self.buffer = rest
        self.state = "chunk_data" if self.left else "trailers"
        return b"%x\r\n" % self.left if self.left else b""

    def _chunk_data(self) -> bytes | None:
        if self.left:
            return self._take()
        if len(self.buffer) < 2:
            return None
        if self.buffer[:2] != b"\r\n":
            raise Refused("a chunk longer than its size")
        self.buffer = self.buffer[2:]
        self.state = "chunk_size"
        return b"\r\n"

    def _trailers(self) -> bytes | None:
        """Trailers are read and dropped: the local server gets none."""
        if self.buffer.startswith(b"\r\n"):
            self.buffer = self.buffer[2:]
            self.state = "done"
            return b"0\r\n\r\n"
        _, found, rest = self.buffer.partition(b"\r\n\r\n")
        if not found:
            if len(self.buffer) > MAX_HEAD:
                raise Refused("trailers too large")
            return None
        self.buffer = rest
        self.state = "done"
        return b"0\r\n\r\n"


class LocalStream:
    """One relayed request: read and checked (RequestReader) before a connection to the
    loopback port is opened, then written to it as it is read."""

    def __init__(self, tunnel: "Tunnel", stream_id: bytes):
        self.tunnel = tunnel
        self.id = stream_id
        self.request = RequestReader(tunnel.port)
        self.writer = None
        self.pump = None
        self.refused = False
        # Sent to Quor and not acknowledged; set whenever there is room in the window.
        self.in_flight = 0
        self.room = asyncio.Event()
        self.room.set()
        # Written to the local server and not acknowledged yet; the task acknowledging.
        self.to_acknowledge = 0
        self.acknowledging = None

    async def data(self, payload: bytes) -> None:
        if self.refused:
            return
        try:
            out = self.request.feed(payload)
        except Refused as refusal:
            if self.writer is not None:  # a body gone wrong: the local request is cut off
                print(f"quor tunnel: a stream was cut off ({refusal})", file=sys.stderr)
                self.refused = True
                return self.close()
            return await self.answer(BAD_REQUEST)
        if self.writer is None and self.request.started:
            try:
                reader, self.writer = await asyncio.open_connection(LOOPBACK, self.tunnel.port)
            except OSError:
                return await self.answer(BAD_GATEWAY)
            self.pump = asyncio.create_task(self.relay(reader))
        if out:
            self.writer.write(out)
        self.to_acknowledge += len(payload)
        if self.to_acknowledge >= self.tunnel.window // 4 and self.acknowledging is None:
            self.acknowledging = asyncio.create_task(self.acknowledge())

    async def acknowledge(self) -> None:
        """Once the local server's socket took what was written (or nothing needed
        writing), Quor may send that much more."""
        try:
            while self.to_acknowledge >= self.tunnel.window // 4:
                if self.writer is not None:
                    await self.writer.drain()
                count, self.to_acknowledge = self.to_acknowledge, 0
                await self.tunnel.send(b"a", self.id, b"%d" % count)
        except OSError:
            pass  # the local connection is gone: the stream ends
        finally:
            self.acknowledging = None

    def acknowledged(self, count: int) -> None:
        self.in_flight = max(0, self.in_flight - count)
        if self.in_flight < self.tunnel.window:
            self.room.set()

    async def answer(self, response: bytes) -> None:
        """Answered without the local server, which never sees the request."""
        self.refused = True
        await self.tunnel.send(b"d", self.id, response)
        await self.tunnel.send(b"c", self.id)
        self.tunnel.streams.pop(self.id, None)

    async def relay(self, reader: asyncio.StreamReader) -> None:
        status_line = b""  # of a WebSocket upgrade's answer, until it says 101 or not
        try:
            while True:
                await self.room.wait()  # the local connection is not read meanwhile
                data = await reader.read(min(READ_BYTES, self.tunnel.window - self.in_flight))
                if not data:
                    break
                self.in_flight += len(data)
                if self.in_flight >= self.tunnel.window:
                    self.room.clear()
                if self.request.websocket and len(status_line) < len(UPGRADE_ACCEPTED):
                    status_line += data[: len(UPGRADE_ACCEPTED)]
                    if len(status_line) >= len(UPGRADE_ACCEPTED):
                        accepted = status_line.startswith(UPGRADE_ACCEPTED)
                        if early := self.request.upgrade_answered(accepted):
                            self.writer.write(early)
                await self.tunnel.send(b"d", self.id, data)
        except (OSError, ConnectionClosed):
            pass
        finally:
            if self.tunnel.streams.pop(self.id, None) is not None:
                await self.tunnel.send(b"c", self.id)
            self.writer.close()

    def close(self) -> None:
        if self.pump is not None:
            self.pump.cancel()
        if self.acknowledging is not None:
            self.acknowledging.cancel()
        if self.writer is not None:
            self.writer.close()


class Tunnel:
    def __init__(self, *, url: str, port: int, token: str, operator_token: str):
        self.url = url
        self.port = port
        self.token = token
        self.operator_token = operator_token
        self.streams: dict[bytes, LocalStream] = {}
        self.websocket = None
        self.window = 0  # as Quor says when the tunnel opens

    async def send(self, kind: bytes, stream_id: bytes, data: bytes = b"") -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.websocket.send(kind + stream_id + data)

    async def run(self) -> int:
        base = urlsplit(self.url)
        scheme = "wss" if base.scheme == "https" else "ws"
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.operator_token:
            headers["X-Quor-Operator-Token"] = self.operator_token
        address = f"{scheme}://{base.netloc}/ws/tunnels/?port={self.port}&protocol={PROTOCOL}"
        try:
            async with connect(
                address,
                additional_headers=headers,
                origin=f"{base.scheme}://{base.netloc}",
                max_size=2 * READ_BYTES,
            ) as websocket:
                self.websocket = websocket
                return await self.serve(websocket)
        except InvalidStatus as error:
            return fail(f"Quor refused the connection (HTTP {error.response.status_code}).")
        except (OSError, InvalidHandshake) as error:
            return fail(f"cannot connect to {self.url}: {error}")
        except ConnectionClosed:
            return fail("the connection to Quor was lost.")
        finally:
            for stream in self.streams.values():
                stream.close()

    async def serve(self, websocket) -> int:
        opened = json.loads(await websocket.recv())
        if "error" in opened:
            return fail(f"{opened['message']} ({opened['error']})")
        print(f"Forwarding {opened['url']} -> http://{LOOPBACK}:{self.port}", flush=True)
        ends = opened["expires_at"]
        self.window = opened["window"]
        print(f"It is private to you until you share it; it ends at {ends}.", flush=True)
        async for frame in websocket:
            if isinstance(frame, str):
                ended = json.loads(frame).get("closed", "closed")
                print(f"The tunnel ended ({ended}).", flush=True)
                return 0
            kind, stream_id = frame[:1], frame[1 : 1 + STREAM_ID_CHARS]
            if kind == b"o":
                self.streams[stream_id] = LocalStream(self, stream_id)
            elif kind == b"d" and stream_id in self.streams:
                await self.streams[stream_id].data(frame[1 + STREAM_ID_CHARS :])
            elif kind == b"a" and stream_id in self.streams:
                count = frame[1 + STREAM_ID_CHARS :]
                if count.isdigit():
                    self.streams[stream_id].acknowledged(int(count))
            elif kind == b"c" and stream_id in self.streams:
                self.streams.pop(stream_id).close()
                if reason := frame[1 + STREAM_ID_CHARS :].decode("ascii", "replace"):
                    print(f"quor tunnel: Quor closed a stream (tunnels.{reason})", file=sys.stderr)
        return fail("the connection to Quor was lost.")


def fail(message: str) -> int:
    print(f"quor: {message}", file=sys.stderr, flush=True)
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="quor", description="Quor's command line.")
    commands = parser.add_subparsers(dest="command", required=True)
    tunnel = commands.add_parser(
        "tunnel",
        help="give a server on 127.0.0.1:PORT a Quor URL",
        description="Relays a Quor URL to 127.0.0.1:PORT while it runs. The API token "
        "comes from QUOR_TOKEN; the operator token, if the deployment requires it, "
        "from QUOR_OPERATOR_TOKEN.",
    )
    tunnel.add_argument("port", type=int, help="the local port (on 127.0.0.1)")
    tunnel.add_argument(
        "--url",
        default=os.environ.get("QUOR_URL", "http://localhost:8000"),
        help="Quor's address (default: $QUOR_URL, else http://localhost:8000)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("QUOR_TOKEN", "")
    if not token:
        return fail("set QUOR_TOKEN to one of your API tokens (Quor: Settings, API tokens).")
    if not 1 <= args.port <= 65535:
        return fail("the port must be a number from 1 to 65535.")
    client = Tunnel(
        url=args.url,
        port=args.port,
        token=token,
        operator_token=os.environ.get("QUOR_OPERATOR_TOKEN", ""),
    )
    try:
        return asyncio.run(client.run())
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
