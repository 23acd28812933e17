"""What the egress proxy does with a sandbox's request: pure functions over plain data.

No Django here (an import contract keeps it so): the proxy plugin and
`manage.py egress_check` call the same code, and tests drive it with tables.
"""

import base64
import binascii
import hmac
import ipaddress
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
    try:
        host = parse_host(raw_host)
    except InvalidHost as exc:
        raise Refusal(400, "egress.invalid_destination", f"Not a valid host: {exc}") from None
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
        expected = {
            _authority(destination.host, destination.port, 443),
            f"{destination.host}:{destination.port}",
        }
        if (host_header or "").lower().rstrip(".") not in expected:
            raise Refusal(
                403,
                "egress.host_mismatch",
                f"The Host header must be {destination.host} on this connection.",
            )
        return
    try:
        same = request_host is not None and (parse_host(request_host), request_port) in (
            destination.requested_target,
            (destination.host, destination.port),
        )
    except InvalidHost:
        same = False
    if not same:
        raise Refusal(
            403,
            "egress.connection_reuse_refused",
            "A kept-alive connection may only be used for the host it was opened for.",
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
