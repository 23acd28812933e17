"""`quor tunnel PORT`: relays a Quor URL to a server on 127.0.0.1:PORT.

The client connects out to Quor over a WebSocket with an API token (QUOR_TOKEN, from
the environment so that it stays out of `ps`), prints the URL Quor gives it, and relays
each request Quor's web app proxy sends to 127.0.0.1:PORT, and nowhere else. Each
relayed stream is one request (or one WebSocket); its request line is read first and
anything but an origin-form target (`/path`) is answered 400 without connecting.

Frames from Quor (binary): one byte for the kind (`o` open, `d` data, `c` close), the
stream's 16 characters, then the data; text frames say what Quor refused or why the
tunnel ended."""

import argparse
import asyncio
import contextlib
import json
import os
import sys
from urllib.parse import urlsplit

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

LOOPBACK = "127.0.0.1"
STREAM_ID_CHARS = 16
# A request line longer than this is refused.
MAX_REQUEST_LINE = 16 * 1024
READ_BYTES = 64 * 1024


def _plain(status: str, text: str) -> bytes:
    body = f"quor tunnel: {text}\n".encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


BAD_REQUEST = _plain("400 Bad Request", "only origin-form request targets are relayed")
BAD_GATEWAY = _plain("502 Bad Gateway", "nothing answers on the local port")


def origin_form(request_line: bytes) -> bool:
    """`METHOD /path HTTP/x`: never an absolute URL, `host:port` or `*`, nor `//host`."""
    parts = request_line.split(b" ")
    return (
        len(parts) == 3
        and parts[1].startswith(b"/")
        and parts[1][1:2] not in (b"/", b"\\")
        and parts[2].startswith(b"HTTP/")
    )


class LocalStream:
    """One relayed request: its head is read until the request line is whole, then a
    connection to the loopback port gets it and everything after."""

    def __init__(self, tunnel: "Tunnel", stream_id: bytes):
        self.tunnel = tunnel
        self.id = stream_id
        self.head = b""
        self.writer = None
        self.pump = None
        self.refused = False

    async def data(self, payload: bytes) -> None:
        if self.refused:
            return
        if self.writer is not None:
            self.writer.write(payload)
            return
        self.head += payload
        line, found, _ = self.head.partition(b"\r\n")
        if not found and len(self.head) <= MAX_REQUEST_LINE:
            return
        if not found or not origin_form(line):
            return await self.answer(BAD_REQUEST)
        try:
            reader, self.writer = await asyncio.open_connection(LOOPBACK, self.tunnel.port)
        except OSError:
            return await self.answer(BAD_GATEWAY)
        self.writer.write(self.head)
        self.head = b""
        self.pump = asyncio.create_task(self.relay(reader))

    async def answer(self, response: bytes) -> None:
        """Answered without the local server, which never sees the request."""
        self.refused = True
        await self.tunnel.send(b"d", self.id, response)
        await self.tunnel.send(b"c", self.id)
        self.tunnel.streams.pop(self.id, None)

    async def relay(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(READ_BYTES):
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

    async def send(self, kind: bytes, stream_id: bytes, data: bytes = b"") -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.websocket.send(kind + stream_id + data)

    async def run(self) -> int:
        base = urlsplit(self.url)
        scheme = "wss" if base.scheme == "https" else "ws"
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.operator_token:
            headers["X-Quor-Operator-Token"] = self.operator_token
        address = f"{scheme}://{base.netloc}/ws/tunnels/?port={self.port}"
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
            elif kind == b"c" and stream_id in self.streams:
                self.streams.pop(stream_id).close()
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
