"""The proxy's TLS connections to upstreams, through proxy.py's own upstream connection
as Quor patches it: a new connection resumes the TLS session of the last one to the
same host and port, and a kept session never stands in for the verification of
another host's certificate or of other trust settings."""

import queue
import shutil
import socket
import ssl
import threading

import pytest
from proxy.core.connection import TcpServerConnection

from egress import ca, tls
from egress.proxy_plugin import reuse_upstream_tls_contexts

HOST = "upstream.test"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return ca.ensure_ca(tmp_path_factory.mktemp("egress-ca"))


@pytest.fixture
def trust(files, tmp_path) -> str:
    """The upstream trust bundle, a file of its own per test: the proxy keeps one context
    and its sessions per bundle, so no test sees another's sessions."""
    path = tmp_path / "trust.pem"
    shutil.copy(files.cert, path)
    return str(path)


class Upstream:
    """A TLS server on loopback with a certificate for `name` alone; for each
    connection it answers one read and reports whether the handshake resumed a session
    (or the error that ended it)."""

    def __init__(self, files, name: str, version: ssl.TLSVersion):
        self.context = tls.LeafContexts(files).context_for(name)
        self.context.maximum_version = version
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handshakes: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            raw.settimeout(10)
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    conn.recv(16)
                    conn.sendall(b"ok")
                    self.handshakes.put(conn.session_reused)
            except OSError as exc:
                self.handshakes.put(exc)

    def close(self):
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() the thread waits in
        self.listener.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture(params=[ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"])
def upstream(files, request):
    server = Upstream(files, HOST, request.param)
    yield server
    server.close()


def exchange(upstream: Upstream, host: str, trust: str) -> bool:
    """One request through proxy.py's upstream connection, as an intercepted connection
    makes it (the host name for SNI and verification, the checked address to connect
    to); returns whether the upstream saw a resumed session."""
    reuse_upstream_tls_contexts()
    conn = TcpServerConnection(host, upstream.port)
    conn.connect(addr=("127.0.0.1", upstream.port))
    try:
        conn.wrap(host, trust)
        conn.send(b"hi")
        assert bytes(conn.recv()) == b"ok"
    finally:
        conn.close()
        resumed = upstream.handshakes.get(timeout=10)  # also after a failed handshake
    assert isinstance(resumed, bool), resumed
    return resumed


def test_a_new_connection_to_the_same_upstream_resumes_the_last_session(upstream, trust):
    assert exchange(upstream, HOST, trust) is False
    assert exchange(upstream, HOST, trust) is True
    assert exchange(upstream, HOST, trust) is True


def test_a_session_kept_for_one_host_never_skips_verifying_another_host(upstream, trust):
    exchange(upstream, HOST, trust)  # a session for upstream.test, on this address and port
    with pytest.raises(ssl.SSLCertVerificationError):
        exchange(upstream, "other.test", trust)  # the certificate is for upstream.test only
    assert exchange(upstream, HOST, trust) is True


def test_a_session_kept_under_one_trust_bundle_is_never_used_under_another(
    upstream, trust, tmp_path
):
    exchange(upstream, HOST, trust)
    foreign = ca.ensure_ca(tmp_path / "foreign-ca")  # trusts nothing the upstream has
    with pytest.raises(ssl.SSLCertVerificationError):
        exchange(upstream, HOST, str(foreign.cert))
    assert exchange(upstream, HOST, trust) is True


def test_an_expired_session_is_not_offered(upstream, trust, monkeypatch):
    monkeypatch.setattr(tls, "UPSTREAM_SESSION_SECONDS", 0)
    exchange(upstream, HOST, trust)
    assert exchange(upstream, HOST, trust) is False


def test_a_failed_handshake_forgets_the_session(upstream, trust, tmp_path):
    exchange(upstream, HOST, trust)
    kept = upstream.context
    # For one connection the upstream has other session keys and a certificate no one trusts.
    upstream.context = tls.LeafContexts(ca.ensure_ca(tmp_path / "other-ca")).context_for(HOST)
    with pytest.raises(ssl.SSLCertVerificationError):
        exchange(upstream, HOST, trust)
    upstream.context = kept  # it would accept the session again
    assert exchange(upstream, HOST, trust) is False
