"""The test web app, run INSIDE a sandbox (standard library only): it echoes the
headers it receives, sets cookies, streams, serves ranges, and echoes WebSocket text.
Its home page (`/`) is a script that probes what the app can reach in a viewer's
browser and shows the results as JSON in `#probe` (`data-done="true"` when finished).

    python3 sandbox_app.py PORT [QUOR_URL]   (QUOR_URL: whose API the probe tries to read)
"""

import base64
import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOB = bytes(range(256)) * 4096  # 1 MiB, for ranges
QUOR_URL = sys.argv[2] if len(sys.argv) > 2 else ""

# What a script of the app sees: its origin, the viewer's cookies and storage, its
# parent's document, and Quor's API with the viewer's credentials.
PROBE_PAGE = """<!doctype html>
<meta charset=utf-8>
<title>Test app</title>
<h1>Test app</h1>
<pre id=probe data-done=false></pre>
<script src="/probe.js"></script>
<script>
(async () => {
  const quor = %s;
  const result = {origin: self.origin, location: location.href, framed: self !== top};
  // A sub-resource of the app: the proxy forwards it only if the viewer cookie came.
  result.subresource = self.subresourceLoaded === true;
  const attempt = (name, fn) => {
    try { result[name] = {value: fn()}; }
    catch (e) { result[name] = {error: `${e.name}: ${e.message}`}; }
  };
  attempt("cookie", () => document.cookie);
  attempt("localStorage", () => { localStorage.setItem("probe", "1"); return "writable"; });
  if (result.framed) attempt("parent", () => parent.document.title);
  const read = async (options) => {
    try {
      const response = await fetch(`${quor}/api/v1/sessions/`, options);
      return {status: response.status, type: response.type, body: await response.text()};
    } catch (e) { return {error: `${e.name}: ${e.message}`}; }
  };
  if (quor) {
    result.fetch = await read({credentials: "include"});
    result.fetchNoCors = await read({credentials: "include", mode: "no-cors"});
  }
  const out = document.getElementById("probe");
  out.textContent = JSON.stringify(result);
  out.dataset.done = "true";
})();
</script>
"""

# What a front server (nginx, Apache, lighttpd, LiteSpeed) would act on in a response:
# an app answering with them tries to make it serve its own files or internal locations.
FRONT_SERVER_HEADERS = [
    ("X-Accel-Redirect", "/internal/secret"),
    ("X-Accel-Buffering", "no"),
    ("X-Sendfile", "/etc/passwd"),
    ("X-LiteSpeed-Location", "/internal/secret"),
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body, content_type="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if self.path.startswith("/stream"):
            size = int(self.path.split("=")[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[: min(size, len(chunk))])
                size -= len(chunk)
            return
        if self.path.startswith("/chunked"):  # a body of unknown length
            size = int(self.path.split("=")[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while size > 0:
                piece = b"x" * min(size, 65536)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                size -= len(piece)
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/blob":
            header = self.headers.get("Range", "")
            if header.startswith("bytes="):
                start, end = (int(x) for x in header[6:].split("-"))
                part = BLOB[start : end + 1]
                return self._send(
                    206, part, "application/octet-stream",
                    [("Content-Range", f"bytes {start}-{end}/{len(BLOB)}"), ("Accept-Ranges", "bytes")],
                )  # fmt: skip
            return self._send(200, BLOB, "application/octet-stream")
        if self.path == "/":
            page = PROBE_PAGE % json.dumps(QUOR_URL)
            return self._send(200, page.encode(), "text/html; charset=utf-8")
        if self.path == "/probe.js":
            return self._send(200, b"self.subresourceLoaded = true;", "text/javascript")
        if self.path == "/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for number in range(3):
                data = f"data: event {number}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        body = json.dumps({"path": self.path, "headers": dict(self.headers.items())}).encode()
        self._send(
            200,
            body,
            extra=[
                ("Set-Cookie", "app_session=stolen; Path=/"),
                ("Set-Cookie", "other=1"),
                *FRONT_SERVER_HEADERS,
            ],
        )

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        digest, remaining = hashlib.sha256(), length
        while remaining:
            chunk = self.rfile.read(min(remaining, 65536))
            digest.update(chunk)
            remaining -= len(chunk)
        self._send(200, json.dumps({"received": length, "sha256": digest.hexdigest()}).encode())

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(
            hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()  # noqa: S324  (the WebSocket handshake is SHA-1)
        ).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2 or head[0] & 0x0F == 0x8:
                return
            length = head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(self.rfile.read(2), "big")
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            reply = b"echo: " + data
            self.wfile.write(bytes([0x81, len(reply)]) + reply)
            self.wfile.flush()


if __name__ == "__main__":
    # The proxy reaches it on the sandbox's bridge address, not on loopback.
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()  # noqa: S104
