"""Fakes of services outside Quor, as real servers on loopback: a DNS server, a
test CA, and HTTP(S) servers that record what they receive."""

import datetime
import json
import socket
import ssl
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dns.message
import dns.rdatatype
import dns.rrset
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class FakeDnsServer:
    """Answers A queries from `records` (name -> list of answers, or a callable
    returning one per query) with `ttls` (name -> seconds, default 5), TXT queries from
    `txt` (name -> list of strings), and counts the queries per name."""

    def __init__(self, host: str, port: int):
        self.records: dict = {}
        self.txt: dict[str, list[str]] = {}
        self.ttls: dict[str, int] = {}
        self.queries: dict[str, int] = defaultdict(int)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                data, client = self.sock.recvfrom(4096)
            except OSError:
                return
            query = dns.message.from_wire(data)
            question = query.question[0]
            name = question.name.to_text().rstrip(".")
            self.queries[name] += 1
            response = dns.message.make_response(query)
            if question.rdtype == dns.rdatatype.TXT:
                texts = self.txt.get(name)
                if texts:
                    quoted = [f'"{text}"' for text in texts]
                    response.answer.append(
                        dns.rrset.from_text(question.name, 5, "IN", "TXT", *quoted)
                    )
                else:
                    response.set_rcode(3)  # NXDOMAIN
                self.sock.sendto(response.to_wire(), client)
                continue
            answer = self.records.get(name)
            if callable(answer):
                answer = answer()
            if question.rdtype == dns.rdatatype.A and answer:
                ttl = self.ttls.get(name, 5)
                response.answer.append(dns.rrset.from_text(question.name, ttl, "IN", "A", *answer))
            elif answer is None:
                response.set_rcode(3)  # NXDOMAIN
            self.sock.sendto(response.to_wire(), client)

    def close(self):
        self.sock.close()


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject, issuer, public_key, signing_key, *, ca: bool, hostnames=()):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if hostnames:
        names = x509.SubjectAlternativeName([x509.DNSName(h) for h in hostnames])
        builder = builder.add_extension(names, critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def make_test_ca(directory: Path, hostnames: list[str]) -> tuple[Path, Path, Path]:
    """A test CA and one server certificate for `hostnames`; returns (ca, cert, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    issuer = "Quor test upstream CA"
    ca = _certificate(issuer, issuer, ca_key.public_key(), ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(
        hostnames[0], issuer, key.public_key(), ca_key, ca=False, hostnames=hostnames
    )
    paths = directory / "upstream-ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


class RecordingServer:
    """An HTTP(S) server that records each request (method, path, headers, body)
    and answers JSON that does not repeat the headers back."""

    def __init__(self, host: str, port: int, *, name: str, tls: tuple[Path, Path] | None = None):
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                recorder.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers.items()),
                        "body": body,
                    }
                )
                payload = json.dumps({"server": name, "path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class SilentServer:
    """Accepts TCP connections and never says a word: an upstream that never
    answers the TLS handshake."""

    def __init__(self, host: str, port: int):
        self.sock = socket.create_server((host, port))
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for connection in self.held:
            connection.close()
