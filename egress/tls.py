"""TLS state the proxy keeps across connections, per proxy process: the server-side
contexts towards sandboxes (one per intercepted host, with its leaf certificate) and
the TLS sessions of upstreams, so that a new intercepted connection pays for neither
a certificate nor a context, and resumes where the peer allows it."""

import ssl
import tempfile
import time

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from egress.ca import CaFiles, issue_leaf
from egress.lru import LruCache

LEAF_REISSUE_SECONDS = 24 * 3600  # well inside ca.LEAF_DAYS
UPSTREAM_SESSION_SECONDS = 3600  # at most; less if the upstream's session says so


class LeafContexts:
    """The server-side context for each intercepted host, its leaf certificate for that
    host alone, reissued after a day. The leaves share one P-256 key, made when the
    proxy starts and never written down (an ECDSA signature costs far less than the
    RSA one of proxy.py's leaves, on every full handshake)."""

    def __init__(self, files: CaFiles, size: int = 1024):
        self._ca_key = serialization.load_pem_private_key(files.key.read_bytes(), None)
        self._ca_cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._scratch = files.leaf_dir
        self._contexts = LruCache(size)

    def context_for(self, host: str) -> ssl.SSLContext:
        found = self._contexts.get(host)
        if found is not None and time.monotonic() - found[0] < LEAF_REISSUE_SECONDS:
            return found[1]
        context = self._new_context(host)
        self._contexts.put(host, (time.monotonic(), context))
        return context

    def _new_context(self, host: str) -> ssl.SSLContext:
        leaf = issue_leaf(self._ca_key, self._ca_cert, host, self._leaf_key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        key = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # load_cert_chain reads only files: a private one (0600), removed at once.
        with tempfile.NamedTemporaryFile(dir=self._scratch, suffix=".pem") as chain:
            chain.write(leaf.public_bytes(serialization.Encoding.PEM) + key)
            chain.flush()
            context.load_cert_chain(chain.name)
        return context


class UpstreamSessions:
    """The last resumable TLS session of each upstream destination, for the one client
    context it was made with (OpenSSL refuses a session of another context): a new
    connection to the same host name and port resumes it and skips the certificate
    exchange and its verification. The host name is the one the session's certificate
    was verified for, so a session is never offered to another host."""

    def __init__(self, size: int = 1024):
        self._sessions = LruCache(size)

    def get(self, host: str, port: int) -> ssl.SSLSession | None:
        found = self._sessions.get((host, port))
        if found is None or time.monotonic() >= found[0]:
            return None
        return found[1]

    def keep(self, host: str, port: int, session: ssl.SSLSession | None) -> None:
        """Keeps `session` if it can be resumed (a TLS 1.3 session only once its ticket
        arrived, after the handshake), in place of the destination's last one."""
        if session is None or not (session.has_ticket or session.id):
            return
        lifetime = min(session.timeout, UPSTREAM_SESSION_SECONDS)
        self._sessions.put((host, port), (time.monotonic() + lifetime, session))

    def forget(self, host: str, port: int) -> None:
        self._sessions.discard((host, port))
