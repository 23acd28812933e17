"""What the egress proxy does with a sandbox's request: pure functions over plain data.

No Django here (an import contract keeps it so): the proxy plugin and
`manage.py egress_check` call the same code, and tests drive it with tables.
"""

import base64
import binascii
import hmac
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase

from apps.policy import AppDecision, AppIndex, SessionApps, credential_headers, decide_app_request
from egress.addresses import InvalidHost, blocked_reason, numeric_address, parse_host

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], list[Address]]

SANDBOX_PRINCIPAL = "sandbox"
# What sandboxes call Quor's API: the proxy forwards it to the real address, which
# sandboxes never learn (and which may be a loopback address of the host).
API_ALIAS = ("quor-api", 80)
SESSION_PRINCIPAL_PREFIX = "s-"


class Refusal(Exception):
    """The proxy answers with `status` and a JSON body carrying a stable code."""

    def __init__(self, status: int, code: str, reason: str, *, headers=None):
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason
        self.headers = headers or {}


@dataclass(frozen=True)
class CredentialRoute:
    """A destination whose requests get a credential in place of the placeholder."""

    kind: str  # quor_api, anthropic, openai, openrouter
    host: str
    port: int
    https: bool
    header: str  # lowercase name of the header that carries the credential
    secret: str | None  # None: the credential cannot be resolved: fail closed


@dataclass(frozen=True)
class SandboxContext:
    """What the proxy knows about one sandbox (by its address on the bridge)."""

    sandbox_id: str
    user_id: int
    organization_id: int
    network_policy: str  # deny, restricted, open
    placeholder: str
    proxy_tokens: Mapping[str, str]  # principal -> token
    routes: tuple[CredentialRoute, ...] = ()
    domain_allow: tuple[str, ...] = ()
    domain_deny: tuple[str, ...] = ()
    apps: AppIndex = field(default_factory=AppIndex)  # the organization's enabled Apps
    sessions: Mapping[str, SessionApps] = field(default_factory=dict)  # by session id
    # App id -> (the credential this sandbox's user gets, "user" or "organization")
    app_credentials: Mapping[int, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class EgressRules:
    control_plane: tuple[str, int]
    private_allowlist: frozenset[tuple[str, int]] = frozenset()
    allowed_ports: frozenset[int] = frozenset({80, 443})


@dataclass(frozen=True)
class Destination:
    """Where the proxy connects; `requested` is what the client asked for (they
    differ only for the Quor API alias)."""

    host: str
    port: int
    addresses: tuple[str, ...]
    route: CredentialRoute | None = None
    intercept: bool = False
    requested: tuple[str, int] | None = None

    @property
    def requested_target(self) -> tuple[str, int]:
        return self.requested or (self.host, self.port)

    @property
    def pinned_address(self) -> str:
        return self.addresses[0]


@dataclass
class PreparedRequest:
    """Header changes for one request; `credential_kind` says what was injected."""

    set_headers: dict[str, str] = field(default_factory=dict)
    credential_kind: str | None = None


# --- reading URLs and request targets --------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}
_PORT = re.compile(r"[0-9]{1,5}")
# host[:port]: the host is an IPv6 literal in brackets or has no colon; the port has none.
_AUTHORITY = re.compile(r"(?P<host>\[[^\]]*\]|[^:]*)(?::(?P<port>[^:]*))?", re.DOTALL)
# The authority ends at the first /, ? or #, as browsers read it.
_URL_REST = re.compile(r"(?P<authority>[^/?#]*)(?P<path>.*)", re.DOTALL)
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")


@dataclass(frozen=True)
class RequestTarget:
    """Where a request goes, read from a URL or a request line."""

    scheme: str  # http or https; "" for a request line's CONNECT or /path target
    host: str | None  # normalised; None for a /path (origin-form) target
    port: int | None
    path: str  # path and query, "/" at least; "" for CONNECT


def parse_destination_host(raw_host: str) -> str:
    """The host normalised. A string that is no DNS name or IP address is refused,
    numeric spellings no resolver can read (`256.1.1.1`, `0x41414141A9FEA9FE`) included."""
    try:
        host = parse_host(raw_host)
        numeric_address(host)
    except InvalidHost as exc:
        raise Refusal(400, "egress.invalid_destination", f"Not a valid host: {exc}.") from None
    return host


def parse_port(text: str) -> int:
    """Digits only: `int()` would also take `+80`, ` 80`, `8_0` and non-ASCII digits."""
    if not _PORT.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise Refusal(
            400, "egress.invalid_port", f"The port must be a number from 1 to 65535, not {text!r}."
        )
    return int(text)


def parse_authority(authority: str, *, default_port: int | None) -> tuple[str, int]:
    """`host[:port]` of a URL, a CONNECT request or a Host header, as (host, port).

    User information (`user@host`) is refused, so no reader can take what precedes
    the `@` for the host. `default_port` None: the port is required (CONNECT)."""
    if "@" in authority:
        raise Refusal(
            400,
            "egress.invalid_destination",
            "User information (user@host) is not accepted; send credentials in a header.",
        )
    match = _AUTHORITY.fullmatch(authority)
    if match is None:
        raise Refusal(
            400,
            "egress.invalid_destination",
            f"Not a valid host[:port]: {authority!r} (an IPv6 address goes in brackets).",
        )
    host = parse_destination_host(match["host"])
    if match["port"] is not None:
        return host, parse_port(match["port"])
    if default_port is None:
        raise Refusal(
            400, "egress.invalid_port", f"{authority!r} has no port: CONNECT needs host:port."
        )
    return host, default_port


def _request_path(path: str) -> str:
    """The path and query a request sends: the fragment never leaves the client, and a
    space or control character could end the request line early upstream."""
    path = path.partition("#")[0]
    if _SPACE_OR_CONTROL.search(path):
        raise Refusal(
            400,
            "egress.malformed_request",
            f"The path has a space or a control character: {path!r}; percent-encode it.",
        )
    return path if path.startswith("/") else f"/{path}"


def parse_url(url: str) -> RequestTarget:
    """An `http://` or `https://` URL, read the one way that egress_check and the proxy
    share, so that they cannot disagree on where a request goes."""
    scheme, separator, rest = url.partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in _DEFAULT_PORTS:
        raise Refusal(
            400, "egress.invalid_scheme", f"The URL must start with http:// or https://: {url!r}."
        )
    parts = _URL_REST.fullmatch(rest)
    host, port = parse_authority(parts["authority"], default_port=_DEFAULT_PORTS[scheme])
    return RequestTarget(scheme, host, port, _request_path(parts["path"]))


def parse_request_target(method: str, target: bytes) -> RequestTarget:
    """The target of a request line to the proxy: `host:port` for CONNECT, an `http://`
    URL for any other method (HTTPS goes through CONNECT), or a `/path` inside a
    tunnel, where the connection says where it goes (`check_request_target`)."""
    try:
        text = target.decode()
    except UnicodeDecodeError:
        raise Refusal(
            400, "egress.malformed_request", f"The request target is not UTF-8: {target!r}."
        ) from None
    if method == "CONNECT":
        host, port = parse_authority(text, default_port=None)
        return RequestTarget("", host, port, "")
    if text.startswith("/"):
        return RequestTarget("", None, None, _request_path(text))
    url = parse_url(text)
    if url.scheme != "http":
        raise Refusal(
            400,
            "egress.invalid_scheme",
            "An https:// URL goes through CONNECT (HTTPS_PROXY), never as a plain proxy "
            "request: the proxy would send it unencrypted.",
        )
    return url


_UNREADABLE_PARTS = {
    "request_line": (
        "The request line could not be read: send METHOD http://host/path HTTP/1.1,"
        " or CONNECT host:port HTTP/1.1."
    ),
    "headers": (
        "A header line could not be read: each is `Name: value`, a Content-Length"
        " a number of bytes."
    ),
    "body": "The body could not be read: its chunked encoding is broken.",
    None: (
        "Not an HTTP/1.1 proxy request: send the whole URL (GET http://host/path HTTP/1.1)"
        " or CONNECT host:port HTTP/1.1."
    ),
}


def unreadable_request(part: str | None) -> Refusal:
    """The answer to a request the proxy could not read, naming the part that broke
    (`request_line`, `headers`, `body`); None: read whole, but no proxy request (a
    `/path` where the whole URL belongs, an unknown HTTP version)."""
    return Refusal(400, "egress.malformed_request", _UNREADABLE_PARTS[part])


# --- identity ------------------------------------------------------------------------


def authenticate(context: SandboxContext, proxy_authorization: str | None) -> str:
    """The principal (`sandbox` or `s-<session id>`) whose token the request carries."""
    if not proxy_authorization:
        raise Refusal(
            407,
            "egress.proxy_auth_required",
            "The proxy needs the session's credentials (Proxy-Authorization).",
            headers={"Proxy-Authenticate": 'Basic realm="quor-egress"'},
        )
    scheme, _, encoded = proxy_authorization.strip().partition(" ")
    try:
        principal, _, token = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        principal = token = ""
    expected = context.proxy_tokens.get(principal, "")
    # Compare even when the principal is unknown, so timing says nothing about which.
    valid = hmac.compare_digest(token.encode(), (expected or "\x00" * 43).encode())
    if scheme.lower() != "basic" or not expected or not valid:
        raise Refusal(
            403,
            "egress.unidentified_session",
            "The proxy credentials do not belong to this sandbox.",
        )
    return principal


# --- destinations -------------------------------------------------------------------------


def domain_matches(host: str, patterns: tuple[str, ...]) -> bool:
    """`example.com` matches itself; `*.example.com` matches its subdomains."""
    return any(fnmatchcase(host, pattern.lower()) for pattern in patterns)


def find_route(context: SandboxContext, host: str, port: int) -> CredentialRoute | None:
    return next((r for r in context.routes if (r.host, r.port) == (host, port)), None)


def _check_policy(context: SandboxContext, host: str, port: int, route):
    if domain_matches(host, context.domain_deny):
        raise Refusal(403, "egress.policy_denied", f"{host} is on the organization's denylist.")
    if context.network_policy == "deny":
        raise Refusal(403, "egress.policy_denied", "This sandbox may only reach the Quor API.")
    restricted = context.network_policy == "restricted" or bool(context.domain_allow)
    configured = route is not None or context.apps.serves(host, port)
    if restricted and not configured and not domain_matches(host, context.domain_allow):
        raise Refusal(
            403,
            "egress.policy_denied",
            f"{host} is not allowed: only model providers, Apps and allowed domains are.",
        )


def resolve_checked(host: str, resolve: Resolver, *, check: bool) -> tuple[str, ...]:
    """Every address the name has, each one checked: one private answer blocks all."""
    literal = numeric_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = resolve(host)
        except LookupError as exc:
            raise Refusal(
                403, "egress.dns_failure", f"{host} could not be resolved: {exc}"
            ) from None
        if not addresses:
            raise Refusal(403, "egress.dns_failure", f"{host} has no address.")
    if check:
        for address in addresses:
            reason = blocked_reason(address)
            if reason is not None:
                raise Refusal(
                    403,
                    "egress.private_destination",
                    f"{host} resolves to {address}, a {reason.replace('_', ' ')} address.",
                )
    return tuple(str(address) for address in addresses)


def decide_destination(
    context: SandboxContext, rules: EgressRules, raw_host: str, port: int, resolve: Resolver
) -> Destination:
    """Where the connection may go and what the proxy must do on it; raises Refusal."""
    host = parse_destination_host(raw_host)
    if (host, port) in (API_ALIAS, rules.control_plane):
        api_host, api_port = rules.control_plane
        addresses = resolve_checked(api_host, resolve, check=False)
        route = find_route(context, api_host, api_port)
        return Destination(api_host, api_port, addresses, route, requested=(host, port))
    route = find_route(context, host, port)
    _check_policy(context, host, port, route)
    allowlisted = (host, port) in rules.private_allowlist
    addresses = resolve_checked(host, resolve, check=not allowlisted)
    if port not in rules.allowed_ports and route is None and not allowlisted:
        raise Refusal(403, "egress.port_not_allowed", f"Port {port} is not allowed.")
    # App hosts are intercepted so that each request inside meets its App's policy.
    intercept = bool(route and route.https) or context.apps.serves(host, port)
    return Destination(host, port, addresses, route, intercept=intercept)


# --- requests inside a connection ----------------------------------------------------------


def upstream_host_header(destination: Destination) -> str | None:
    """The Host header the upstream expects when the client used the Quor API alias."""
    if destination.requested is None:
        return None
    return _authority(destination.host, destination.port, 443 if destination.intercept else 80)


def _authority(host: str, port: int, default_port: int) -> str:
    host_part = f"[{host}]" if ":" in host else host
    return host_part if port == default_port else f"{host_part}:{port}"


def check_request_target(
    destination: Destination,
    *,
    request_host: str | None,
    request_port: int | None,
    host_header: str | None,
    intercepted: bool,
) -> None:
    """A request must go where the connection was checked and credentials bound."""
    if intercepted:
        target = None if host_header is None else parse_authority(host_header, default_port=443)
        if target != (destination.host, destination.port):
            raise Refusal(
                403,
                "egress.host_mismatch",
                f"The Host header must be {destination.host} on this connection.",
            )
        return
    if request_host is None:
        raise Refusal(
            400,
            "egress.malformed_request",
            "A request to the proxy names its whole URL (GET http://host/path), not a path.",
        )
    checked = (destination.requested_target, (destination.host, destination.port))
    if (parse_destination_host(request_host), request_port) not in checked:
        raise Refusal(
            403,
            "egress.connection_reuse_refused",
            "A kept-alive connection may only be used for the host it was opened for.",
        )
    # The Host names the site that was checked: another one behind a shared front end
    # (domain fronting) would be reached past its checks.
    if host_header is not None and parse_authority(host_header, default_port=80) not in checked:
        raise Refusal(
            403,
            "egress.host_mismatch",
            f"The Host header must name the URL's host ({destination.requested_target[0]}).",
        )


def prepare_request(
    context: SandboxContext,
    destination: Destination,
    headers: Mapping[str, str],
    *,
    target: str = "",
) -> PreparedRequest:
    """Puts the real credential where the placeholder is, only for its own destination.

    `headers` maps lowercase names to values; `target` is the request line's path.
    A placeholder anywhere else is refused, and so is a placeholder for a credential
    that cannot be resolved: nothing is forwarded with a placeholder in it.
    """
    placeholder = context.placeholder
    prepared = PreparedRequest()
    route = destination.route
    for name, value in headers.items():
        if placeholder not in value:
            continue
        if route is None or name != route.header:
            raise Refusal(
                403,
                "egress.placeholder_misuse",
                f"A credential placeholder was sent to {destination.host} in {name}; "
                "credentials only go to their own service.",
            )
        if route.secret is None:
            raise Refusal(
                403,
                "egress.credential_unavailable",
                f"No {route.kind} credential is available to this sandbox.",
            )
        prepared.set_headers[name] = value.replace(placeholder, route.secret)
        prepared.credential_kind = route.kind
    if placeholder in target:
        raise Refusal(
            403, "egress.placeholder_misuse", "A credential placeholder was sent in the URL."
        )
    return prepared


# --- App requests ----------------------------------------------------------------------------

APP_REFUSALS = {
    "apps.action_denied": "Your organization does not allow {what}. Do not retry; tell the user.",
    "apps.not_selected": "{app} is not enabled for this session. The user can start a session "
    "with it.",
    "apps.nobody_to_ask": "{what} needs the user's approval, and nobody can answer during this "
    "scheduled run ({app} is not pre-approved for the task). It was not sent; do not retry.",
    "apps.noncanonical_path": "Requests to {app} must use a plain path (no dot segments, empty "
    "segments or encoded slashes).",
    "approvals.rejected": "The user rejected {what}. It was not sent; do not retry it, ask the "
    "user what to do instead.",
    "approvals.expired": "Nobody approved {what} in time. It was not sent; ask the user before "
    "trying again.",
    "approvals.unavailable": "{what} needs the user's approval, but approvals are unavailable "
    "right now. It was not sent; try again later.",
}


def app_action_label(decision: AppDecision) -> str:
    names = ", ".join(action.name for action in decision.actions) or "this request"
    return f"{decision.app.name}: {names}" if decision.app else names


def app_refusal(code: str, decision: AppDecision) -> Refusal:
    what = app_action_label(decision)
    app = decision.app.name if decision.app else "this App"
    return Refusal(403, code, APP_REFUSALS[code].format(what=what, app=app))


def decide_app(
    context: SandboxContext,
    destination: Destination,
    *,
    session_id: str | None,
    method: str,
    target: str,
    intercepted: bool,
    extra_grants: frozenset[tuple[int, str]] = frozenset(),
) -> AppDecision:
    """The App policy's answer for one request on this connection."""
    session = context.sessions.get(session_id) if session_id else None
    if session is not None and extra_grants:
        session = replace(session, grants=session.grants | extra_grants)
    return decide_app_request(
        context.apps,
        session,
        method=method,
        scheme="https" if intercepted else "http",
        host=destination.host,
        port=destination.port,
        target=target,
    )


def app_credential(
    context: SandboxContext, decision: AppDecision, headers: Mapping[str, str]
) -> dict[str, str]:
    """The App's credential header(s) for an allowed request. Without a connected
    credential the request goes as the sandbox sent it, unless that carries the
    placeholder: nothing is forwarded with a placeholder in it."""
    app = decision.app
    secret, _ = context.app_credentials.get(app.app_id, (None, ""))
    if secret:
        return credential_headers(app, secret)
    carried = headers.get(app.credential_header, "")
    if context.placeholder in carried:
        raise Refusal(
            403,
            "egress.credential_unavailable",
            f"No {app.name} credential is connected for this user; connect one on the Apps "
            "page, or ask an administrator for the organization's.",
        )
    return {}
