"""The proxy.py plugin: thin. It reads what proxy.py parsed, asks the egress
decision functions what to do, and applies the answer.

proxy.py runs with --threaded, so a slow or silent client holds only its own
thread. Request threads never touch the database: the directory and the audit log
each have one background thread per proxy process.
"""

import functools
import json
import logging
import os
import select
import ssl
import threading
from http import HTTPStatus

from django.conf import settings
from proxy.common.constants import DEFAULT_BUFFER_SIZE, DEFAULT_SSL_CONTEXT_OPTIONS
from proxy.core.connection import TcpServerConnection
from proxy.http.exception import HttpProtocolException, HttpRequestRejected
from proxy.http.handler import HttpProtocolHandler
from proxy.http.parser import HttpParser, httpParserStates, httpParserTypes
from proxy.http.proxy import HttpProxyBasePlugin, HttpProxyPlugin
from proxy.http.url import Url

from approvals.models import ApprovalRequest
from approvals.wakeup import DecisionListener
from apps import policy
from egress import ca, tls
from egress.audit import AuditLog, mask_path
from egress.decisions import (
    SESSION_PRINCIPAL_PREFIX,
    Refusal,
    app_action_label,
    app_credential,
    app_refusal,
    authenticate,
    check_request_target,
    decide_app,
    decide_destination,
    parse_destination_host,
    parse_request_target,
    prepare_request,
    unreadable_request,
    upstream_host_header,
)
from egress.directory import Directory
from egress.models import EgressDecision
from egress.parking import GRANTED, ApprovalDesk
from egress.resolver import make_resolver
from quor.lib import metrics

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-quor-session"
READY_WAIT_SECONDS = 10
# A sandbox that sends CONNECT and then nothing would hold a thread for ever (proxy.py's
# idle timeout cannot run during a blocking handshake).
SANDBOX_HANDSHAKE_TIMEOUT_S = 10


class _ProcessState:
    """Per-process singletons, created after proxy.py forked its acceptors."""

    _lock = threading.Lock()
    _pid = None
    _instance = None

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._pid != os.getpid():
                cls._instance = cls()
                cls._pid = os.getpid()
            return cls._instance

    def __init__(self):
        self.directory = Directory()
        self.directory.start()
        self.audit = AuditLog()
        self.audit.start()
        self.resolve = make_resolver(settings.QUOR_EGRESS_DNS_SERVER)
        self.desk = ApprovalDesk(DecisionListener(on_config_changed=self.directory.refresh_later))
        self.desk.start()


def rejection(refusal: Refusal) -> HttpRequestRejected:
    body = json.dumps({"error": {"code": refusal.code, "message": refusal.reason}}).encode()
    headers = {b"Content-Type": b"application/json"}
    headers.update({k.encode(): v.encode() for k, v in refusal.headers.items()})
    return HttpRequestRejected(
        status_code=refusal.status,
        reason=HTTPStatus(refusal.status).phrase.encode(),
        headers=headers,
        body=body,
    )


def _text(value) -> str:
    return (
        value.decode("latin-1")
        if isinstance(value, bytes | bytearray | memoryview)
        else str(value or "")
    )


def _proxy_authorization(request: HttpParser) -> str | None:
    if not request.has_header(b"proxy-authorization"):
        return None
    return _text(request.header(b"proxy-authorization")) or None


def _authenticated(context, proxy_authorization: str | None) -> tuple[str | None, Refusal | None]:
    if context is None:
        return None, Refusal(
            403, "egress.unidentified_sandbox", "This address belongs to no sandbox."
        )
    try:
        return authenticate(context, proxy_authorization), None
    except Refusal as refusal:
        return None, refusal


def identify(directory: Directory, address: str, proxy_authorization: str | None):
    """Who sent a request: (the sandbox at `address` or None, the principal its proxy
    credentials name or None, the refusal if either is missing). A sandbox or session
    made a moment ago may not be loaded yet: the directory is refreshed once first."""
    if not directory.wait_until_ready(READY_WAIT_SECONDS):
        return (
            None,
            None,
            Refusal(503, "egress.not_ready", "The egress proxy is starting; retry shortly."),
        )
    context = directory.context_for(address)
    principal, refusal = _authenticated(context, proxy_authorization)
    if refusal is not None:
        directory.refresh_soon()
        context = directory.context_for(address)
        principal, refusal = _authenticated(context, proxy_authorization)
    return context, principal, refusal


def session_of(principal: str | None) -> str | None:
    if principal and principal.startswith(SESSION_PRINCIPAL_PREFIX):
        return principal[len(SESSION_PRINCIPAL_PREFIX) :]
    return None


def record_decision(
    state: _ProcessState,
    request: HttpParser,
    outcome: str,
    *,
    client_address: str,
    context=None,
    session_id: str | None = None,
    destination=None,
    refusal: Refusal | None = None,
    credential_kind: str = "",
) -> None:
    """One audit record and one count of a decision: the plugin's, and proxy.py's
    refusals of what it could not read (`EgressProtocolHandler`), alike."""
    state.audit.record(
        sandbox_id=context.sandbox_id if context else None,
        session_id=session_id,
        client_address=client_address,
        # PostgreSQL text cannot hold NUL: one would lose the whole batch.
        method=_text(request.method)[:16].replace("\x00", ""),
        host=destination.host if destination else _text(request.host)[:253],
        port=destination.port if destination else request.port,
        path=_text(request.path) if not request.is_https_tunnel else "",
        outcome=outcome,
        code=refusal.code if refusal else "",
        reason=refusal.reason if refusal else "",
        addresses=list(destination.addresses) if destination else [],
        credential_kind=credential_kind or "",
    )
    metrics.egress_decided(
        outcome=outcome,
        code=refusal.code if refusal else "",
        network_policy=context.network_policy if context else "unknown",
    )


def _target_refusal(request: HttpParser) -> Refusal | None:
    """Why the request's target is malformed, as `read_request_targets` found it."""
    return getattr(request, "quor_refusal", None)


class QuorEgressPlugin(HttpProxyBasePlugin):
    """Identity, destination checks, DNS pinning, credential injection, audit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state = _ProcessState.get()
        self.context = None
        self.principal = None
        self.destination = None
        self.tunnel = False

    # --- helpers -------------------------------------------------------------------

    def _record(self, request, outcome, *, refusal=None, credential_kind=""):
        record_decision(
            self.state,
            request,
            outcome,
            client_address=self.client.addr[0],
            context=self.context,
            session_id=self.session_id,
            destination=self.destination,
            refusal=refusal,
            credential_kind=credential_kind,
        )

    @property
    def session_id(self) -> str | None:
        return session_of(self.principal)

    def _refuse(self, request, refusal: Refusal):
        self._record(request, EgressDecision.Outcome.BLOCKED, refusal=refusal)
        return rejection(refusal)

    # --- proxy.py hooks ------------------------------------------------------------

    def before_upstream_connection(self, request: HttpParser):
        try:
            self.context, self.principal, refusal = identify(
                self.state.directory, self.client.addr[0], _proxy_authorization(request)
            )
            if refusal is not None:
                raise refusal
            if (refusal := _target_refusal(request)) is not None:
                raise refusal
            self.destination = decide_destination(
                self.context,
                self.state.directory.rules,
                _text(request.host),
                request.port,
                self.state.resolve,
            )
        except Refusal as refusal:
            raise self._refuse(request, refusal) from None
        self.tunnel = request.is_https_tunnel
        if request.is_https_tunnel and not self.destination.intercept:
            self._record(request, EgressDecision.Outcome.TUNNELED)
        if (self.destination.host, self.destination.port) != self.destination.requested_target:
            request.host, request.port = self.destination.host.encode(), self.destination.port
        return request

    def resolve_dns(self, host: str, port: int):
        """Connect to exactly the address that was checked: no second lookup."""
        return (self.destination.pinned_address if self.destination else None), None

    def do_intercept(self, request: HttpParser) -> bool:
        return bool(self.destination and self.destination.intercept)

    def handle_client_request(self, request: HttpParser):
        if (refusal := _target_refusal(request)) is not None:
            raise self._refuse(request, refusal)
        if request.is_https_tunnel:
            return request
        request.del_header(b"proxy-authorization")
        request.del_header(SESSION_HEADER.encode())
        try:
            # Inside an intercepted tunnel requests name a path (the CONNECT target is the
            # destination); a URL there would be matched as plain http, past the App's rules.
            if self.tunnel and request.host is not None:
                raise Refusal(
                    400,
                    "egress.malformed_request",
                    "Inside a CONNECT tunnel a request names a path, not a URL.",
                )
            intercepted = self.tunnel
            check_request_target(
                self.destination,
                request_host=None if request.host is None else _text(request.host),
                request_port=request.port,
                host_header=_text(request.header(b"host")) if request.has_header(b"host") else None,
                intercepted=intercepted,
            )
            headers = (
                {_text(k).lower(): _text(v[1]) for k, v in request.headers.items()}
                if request.headers
                else {}
            )
            app_headers, app_kind = self._apply_app_policy(request, intercepted, headers)
            prepared = prepare_request(
                self.context, self.destination, headers, target=_text(request.path)
            )
        except Refusal as refusal:
            raise self._refuse(request, refusal) from None
        if app_headers:
            prepared.set_headers.update(app_headers)
            prepared.credential_kind = app_kind
        host_header = upstream_host_header(self.destination)
        if host_header:
            prepared.set_headers["host"] = host_header
        for name, value in prepared.set_headers.items():
            request.del_header(name.encode())
            request.add_header(name.encode(), value.encode())
        if prepared.credential_kind == "quor_api" and self.session_id:
            request.add_header(SESSION_HEADER.encode(), self.session_id.encode())
        outcome = (
            EgressDecision.Outcome.INJECTED
            if prepared.credential_kind
            else EgressDecision.Outcome.FORWARDED
        )
        self._record(request, outcome, credential_kind=prepared.credential_kind)
        return request

    def _apply_app_policy(self, request, intercepted: bool, headers: dict):
        """Decides the request by its App's policy, parking it for the user's approval
        when it must; returns the credential headers to set (removing what the sandbox
        sent in their place from `headers`) and the audit's credential kind."""
        target = _text(request.path)
        method = _text(request.method).upper()
        decision = decide_app(
            self.context,
            self.destination,
            session_id=self.session_id,
            method=method,
            target=target,
            intercepted=intercepted,
            extra_grants=self.state.desk.listener.grants_for(self.session_id or ""),
        )
        if decision.outcome == policy.REFUSE:
            raise app_refusal(decision.reason, decision)
        if decision.outcome == policy.PARK:
            self._park(decision, method, target, intercepted, request.body)
        if decision.outcome == policy.FORWARD:
            return {}, ""
        credential = app_credential(self.context, decision, headers)
        headers.pop(decision.app.credential_header, None)
        for name in credential:
            headers.pop(name, None)
        return credential, f"app:{decision.app.app_id}"

    def _client_gone(self) -> bool:
        """A waiting client sends nothing until it has its answer: a readable socket
        means it closed the connection (or broke the protocol). Nothing is sent then."""
        try:
            readable, _, _ = select.select([self.client.connection], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _park(self, decision, method: str, target: str, intercepted: bool, body) -> None:
        """Waits for the session owner; returns only if the request was approved. The
        user sees the start of its body (`body`, all of it: proxy.py buffers it)."""
        destination = self.destination
        scheme = "https" if intercepted else "http"
        default_port = 443 if intercepted else 80
        port = "" if destination.port == default_port else f":{destination.port}"
        status = self.state.desk.park_and_wait(
            session_id=self.session_id,
            app_id=decision.app.app_id,
            app_name=decision.app.name,
            actions=[{"key": a.key, "name": a.name, "policy": a.policy} for a in decision.actions],
            method=method,
            url=f"{scheme}://{destination.host}{port}{mask_path(target)}",
            summary=f"{app_action_label(decision)} ({method} {mask_path(target).split('?')[0]})",
            body=bytes(body or b""),
            client_gone=self._client_gone,
        )
        if status in (ApprovalRequest.Status.APPROVED, GRANTED):
            return
        code = {
            ApprovalRequest.Status.REJECTED: "approvals.rejected",
            ApprovalRequest.Status.EXPIRED: "approvals.expired",
        }.get(status, "approvals.unavailable")
        raise app_refusal(code, decision)


def cap_request_bodies(limit: int) -> None:
    """proxy.py buffers a whole request body before any plugin hook runs. Refuse a
    body over `limit` while it is parsed, so a sandbox cannot exhaust the proxy's
    memory; `EgressProtocolHandler` answers 413 and records it."""
    original_body = HttpParser._process_body
    if getattr(original_body, "quor_capped", False):
        return
    too_large = Refusal(
        413, "egress.body_too_large", f"Request bodies are limited to {limit} bytes."
    )

    def process_body(self, raw):
        if self.type == httpParserTypes.REQUEST_PARSER:
            length = self.header(b"content-length") if self.has_header(b"content-length") else b"0"
            if int(length) > limit or len(self.body or b"") + len(raw) > limit:
                self.quor_unreadable = too_large
                raise too_large
        return original_body(self, raw)

    process_body.quor_capped = True
    HttpParser._process_body = process_body


def read_request_targets() -> None:
    """proxy.py reads request targets loosely: `int()` takes the ports `+80` and `1_8080`,
    a `#` or `?` in the authority moves the host (`http://a.test#@b.test/` goes to
    b.test), user information is dropped unseen, and `GET https://...` goes out
    unencrypted. Every request target is read by `parse_request_target` instead, so the
    proxy goes exactly where egress_check says. A malformed one is kept on the request
    for the plugin, which answers it once it knows who asked, and records it."""
    original = HttpParser.set_url
    if getattr(original, "quor_strict", False):
        return

    def set_url(self, url, allowed_url_schemes=None):  # parse_request_target decides schemes
        try:
            target = parse_request_target(_text(self.method), url)
        except Refusal as refusal:
            # Still a proxy request (its host empty, no port), so that it reaches the plugin.
            self.quor_refusal = refusal
            self._url = Url(hostname=b"")
            self.host, self.port, self.path = b"", None, None
            return
        host = target.host
        self._url = Url(
            scheme=target.scheme.encode() or None,
            hostname=None if host is None else (f"[{host}]" if ":" in host else host).encode(),
            port=target.port,
            remainder=target.path.encode() or None,
        )
        self._set_line_attributes()

    set_url.quor_strict = True
    HttpParser.set_url = set_url


_UNREAD_PARTS = {
    httpParserStates.INITIALIZED: "request_line",
    httpParserStates.LINE_RCVD: "headers",
    httpParserStates.RCVING_HEADERS: "headers",
    httpParserStates.HEADERS_COMPLETE: "body",
    httpParserStates.RCVING_BODY: "body",
}


def _unreadable(request: HttpParser) -> Refusal:
    """Why proxy.py could not take `request`: over the body limit, or the part its
    parser stopped at (read whole: no proxy request)."""
    return getattr(request, "quor_unreadable", None) or unreadable_request(
        _UNREAD_PARTS.get(request.state)
    )


class EgressProtocolHandler(HttpProtocolHandler):
    """proxy.py's connection handler (`--work-klass`), which answers what proxy.py
    could not read with a JSON refusal, records it as the plugin records its own, and
    closes the connection. On the first request proxy.py answers a bare 400 (a
    broken line or header, a `/path` or unknown HTTP version), and the plugin does not
    exist yet; on a later one (kept alive, or inside intercepted TLS) proxy.py's
    parser raised out of its handler: a traceback, and the client got no answer."""

    def handle_data(self, data: memoryview) -> bool | None:
        if data is None:
            return super().handle_data(data)
        if self.plugin is None:
            return self._first_request(data)
        try:
            self.plugin.on_client_data(data)
        except Exception as exc:
            later = getattr(self.plugin, "pipeline_request", None)
            if later is not None and not later.is_complete:
                self.work.queue(self._refuse(later, _unreadable(later)))
                return True
            if isinstance(exc, HttpProtocolException):  # a hook's refusal, recorded there
                if (response := exc.response(self.request)) is not None:
                    self.work.queue(response)
                return True
            raise
        return False

    def _first_request(self, data: memoryview) -> bool:
        done = super().handle_data(data)
        if done and self.plugin is None:  # refused by proxy.py: in place of its bare 400
            self.work.buffer[-1:] = [self._refuse(self.request, _unreadable(self.request))]
        return done

    def _refuse(self, request: HttpParser, refusal: Refusal) -> memoryview:
        """Records the refusal; returns the answer to send."""
        egress = self.plugin and self.plugin.plugins.get(QuorEgressPlugin.__qualname__)
        if egress is not None:
            egress._record(request, EgressDecision.Outcome.BLOCKED, refusal=refusal)
        else:
            state = _ProcessState.get()
            address = self.work.addr[0]
            context, principal, _ = identify(
                state.directory, address, _proxy_authorization(request)
            )
            record_decision(
                state,
                request,
                EgressDecision.Outcome.BLOCKED,
                client_address=address,
                context=context,
                session_id=session_of(principal),
                refusal=refusal,
            )
        return rejection(refusal).response(request)


def reuse_upstream_tls_contexts() -> None:
    """proxy.py builds a new upstream SSLContext, parsing the whole trust bundle (about
    20 ms for the host's store), for every intercepted connection, and makes a full
    handshake with certificate verification each time. Build each context once per
    process instead, and resume the last TLS session of the same host name and port
    made with that context (`tls.UpstreamSessions`). A TLS 1.3 session is resumable only
    once its ticket arrived, after the handshake but before the upstream's first answer:
    it is kept when that answer is read (proxy.py's teardown drops the SSL object before
    closing). The rest is proxy.py's."""
    original = TcpServerConnection.wrap
    if getattr(original, "quor_cached", False):
        return
    original_recv = TcpServerConnection.recv

    @functools.lru_cache(maxsize=8)
    def context(ca_file, verify_mode, check_hostname):
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
        ctx.options |= DEFAULT_SSL_CONTEXT_OPTIONS
        ctx.check_hostname = check_hostname
        ctx.verify_mode = verify_mode
        return ctx, tls.UpstreamSessions()

    def wrap(
        self, hostname=None, ca_file=None, as_non_blocking=False, verify_mode=ssl.CERT_REQUIRED
    ):
        check_hostname = verify_mode != ssl.CERT_NONE and hostname is not None
        ctx, sessions = context(ca_file, verify_mode, check_hostname)
        port = self.addr[1]
        session = None if hostname is None else sessions.get(hostname, port)
        self.connection.setblocking(True)
        try:
            self._conn = ctx.wrap_socket(self.connection, server_hostname=hostname, session=session)
        except OSError:
            if session is not None:
                sessions.forget(hostname, port)
            raise
        if hostname is not None:
            self.quor_session_key = (sessions, hostname, port)
        if as_non_blocking:
            self.connection.setblocking(False)

    def recv(self, buffer_size=DEFAULT_BUFFER_SIZE):
        data = original_recv(self, buffer_size)
        key = getattr(self, "quor_session_key", None)
        if data is not None and key is not None:
            sessions, hostname, port = key
            sessions.keep(hostname, port, self.connection.session)
            self.quor_session_key = None
        return data

    wrap.quor_cached = True
    TcpServerConnection.wrap = wrap
    TcpServerConnection.recv = recv


def serve_intercepted_tls_from_cache(files: ca.CaFiles) -> None:
    """proxy.py gives each intercepted connection a new server-side context, reading
    its leaf (made once per host by three `openssl` runs, with an RSA key) from disk,
    and first writes the upstream's certificate to a temporary file to read its
    subject. Take the host's context from `tls.LeafContexts` instead: built once per
    host and process, and a client that resumes its TLS session skips the signature."""
    original = HttpProxyPlugin.wrap_client
    if getattr(original, "quor_cached", False):
        return
    leaves = tls.LeafContexts(files)

    def wrap_client(self) -> bool:
        try:
            host = parse_destination_host(_text(self.request.host))  # as the decision read it
            context = leaves.context_for(host)
            self.client.connection.settimeout(SANDBOX_HANDSHAKE_TIMEOUT_S)
            self.client.flush()  # the 200 answer to CONNECT, before the handshake
            self.client._conn = context.wrap_socket(self.client.connection, server_side=True)
            self.client.connection.setblocking(False)
        except (OSError, ValueError, Refusal) as exc:  # left, silent, refused the certificate
            logger.warning("TLS with the sandbox failed for %r: %s", self.request.host, exc)
            return True
        return False

    wrap_client.quor_cached = True
    HttpProxyPlugin.wrap_client = wrap_client
