"""What the web app proxy decides about a request from its facts alone: pure functions
over plain data, no Django (an import contract keeps it so), driven by tables in
tests/webapps/test_gate.py. `webapps/proxy.py` gathers the facts (the Host's label, the
viewer's verified cookie, the database's answers) and carries the answer out.

A request is decided in up to three steps, each a function here: `route` (from the
request alone), `visit` (a public link's visitor, once the link and its quotas are
read) and `admit` (once the app or tunnel and its address are known)."""

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The proxy's own paths on every app's origin.
HANDOFF_PATH = "/__quor/handoff"
OWN_PATHS_PREFIX = "/__quor/"
LINK_PASSWORD_PATH = "/__quor/link-password"  # noqa: S105 (a path, not a password)
LINK_EMAIL_PATH = "/__quor/link-email"
LINK_CODE_PATH = "/__quor/link-code"
# The public links' sign-in forms and the visitor authentication each is for.
LINK_SIGN_IN_PATHS = {
    LINK_PASSWORD_PATH: "password",
    LINK_EMAIL_PATH: "email",
    LINK_CODE_PATH: "email",
}
# A public link's sign-in form: the most body read before it is answered.
MAX_FORM_BYTES = 4096
# Why a public link's quota refused a request (webapps/link_quotas.py).
REQUESTS_USED_UP, BANDWIDTH_USED_UP = "requests", "bandwidth"

NO_SUCH_APP = "There is no such app, or it is not shared with you."


# --- answers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """The proxy answers with a page of its own; `plain` is the bare 404 of a host
    that is none of Quor's."""

    status: int
    message: str
    refresh: int | None = None
    retry_after: int | None = None
    close: bool = False
    plain: bool = False


@dataclass(frozen=True)
class Redirect:
    """302 to Quor: `to` is "viewer" (Quor's page framing the app) or "login"."""

    to: str
    message: str


@dataclass(frozen=True)
class ReadBody:
    """Read the request's body whole first (refused past `most` bytes), then decide
    again; `continue_first`: say 100 Continue, the viewer waits for it."""

    most: int
    continue_first: bool = False


@dataclass(frozen=True)
class HandOff:
    """The hand-off from Quor: its token is checked, and the viewer's cookie set."""


@dataclass(frozen=True)
class LookUpLink:
    """A public link's visitor: the link and its quotas are read (`visit` decides)."""


@dataclass(frozen=True)
class CheckAccess:
    """A signed-in viewer: whether they may open the app is read (`admit` decides)."""

    user_id: int


@dataclass(frozen=True)
class SignIn:
    """A public link's sign-in form, asked for or answered (webapps/link_sign_in.py)."""


@dataclass(frozen=True)
class SignInPage:
    """The link's first sign-in form, in place of the page asked for (401)."""

    step: str


@dataclass(frozen=True)
class Admit:
    """The visitor may go on to the app (`admit` decides the rest); `new_visitor`: the
    visit is recorded and the visitor gets the link's cookie."""

    new_visitor: bool


@dataclass(frozen=True)
class Forward:
    """Relay the request to the app; `room`: the most response body bytes relayed (a
    tunnel's), None for no bound."""

    room: int | None = None


# --- facts and decisions ---------------------------------------------------------------


@dataclass(frozen=True)
class RequestFacts:
    label: str | None  # the app label the Host names, None: not a host of Quor's
    link: bool  # the label is a public link's
    method: str
    path: str
    fetch_dest: str  # Sec-Fetch-Dest
    viewer: int | None  # the user id of a verified viewer cookie for this label
    body_read: bool  # the request's body is all in


def route(facts: RequestFacts):
    """The first step, from the request alone."""
    if facts.label is None:
        return Reply(404, "Not found.", plain=True)
    if facts.link:
        form = facts.path in LINK_SIGN_IN_PATHS and facts.method == "POST"
        return ReadBody(MAX_FORM_BYTES) if form and not facts.body_read else LookUpLink()
    if facts.path == HANDOFF_PATH:
        return HandOff()
    if facts.fetch_dest == "document":
        # A top-level page of the app: shown framed by Quor's viewer instead.
        return Redirect("viewer", "Opening the app in Quor.")
    if facts.viewer is None:
        return Redirect("login", "Log in to Quor to open this app.")
    return CheckAccess(facts.viewer)


@dataclass(frozen=True)
class LinkFacts:
    found: bool  # the link exists and may be used now
    quota: str  # "", REQUESTS_USED_UP or BANDWIDTH_USED_UP
    retry_after: int
    path: str
    visitor_auth: str  # "none", "password" or "email"
    admitted: bool  # the visitor's link cookie is valid for this link


def visit(facts: LinkFacts):
    """A public link's visitor, once the link and its quotas are read."""
    if not facts.found:
        return Reply(404, "There is no such link, or it has ended.")
    if facts.quota == REQUESTS_USED_UP:
        message = "This link had too many requests this minute. Try again shortly."
        return Reply(429, message, retry_after=facts.retry_after)
    if facts.quota == BANDWIDTH_USED_UP:
        return Reply(429, "This link has served all it may serve.")
    if facts.path in LINK_SIGN_IN_PATHS:
        return SignIn()
    if facts.path.startswith(OWN_PATHS_PREFIX):
        return Reply(404, "Not found.")
    if facts.admitted:
        return Admit(new_visitor=False)
    if facts.visitor_auth != "none":
        return SignInPage(facts.visitor_auth)
    return Admit(new_visitor=True)


@dataclass(frozen=True)
class AppFacts:
    found: bool  # the app or tunnel exists and this viewer may open it
    running: bool  # it has an address to relay to
    waking: bool  # its sandbox was asleep and is waking up
    websocket: bool  # a WebSocket upgrade
    origin_allowed: bool  # the Origin is the app's own, "null" or none
    tunnel: bool  # a local relay tunnel, not a sandbox's app
    # A tunnel's request is relayed whole and bounded: its body's facts.
    max_body: int = 0  # QUOR_TUNNEL_MAX_BODY_BYTES
    content_length: str = ""
    body_bytes: int = 0  # read so far
    has_body: bool = False
    body_read: bool = False
    expect_continue: bool = False


WAKING_RETRY_SECONDS = 3


def admit(facts: AppFacts):
    """The last step: the app (a sandbox's, through a link or not, or a tunnel)."""
    if not facts.found:
        return Reply(404, NO_SUCH_APP)
    if not facts.running and facts.waking:
        message = "Its sandbox was asleep and is waking up: this page reloads by itself."
        return Reply(503, message, refresh=WAKING_RETRY_SECONDS)
    if not facts.running:
        message = "This app is not running. Open its session in Quor to start it again."
        return Reply(503, message)
    if facts.websocket and not facts.origin_allowed:
        return Reply(403, "This page may not open the app's WebSocket.")
    if not facts.tunnel:
        return Forward()
    # A tunnel's request goes to the client whole and bounded: refused over the bound
    # before a byte leaves. Its response's body is bounded the same (Forward.room).
    length = facts.content_length.strip()
    if (length.isdigit() and int(length) > facts.max_body) or facts.body_bytes > facts.max_body:
        return Reply(413, "The request's body is too large.", close=True)
    if facts.has_body and not facts.body_read:
        return ReadBody(facts.max_body, continue_first=facts.expect_continue)
    return Forward(room=facts.max_body)


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """The front proxies' addresses or networks (`10.0.0.5`, `10.0.0.0/24`, `fd00::/8`);
    ValueError names an entry that is neither."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not an address or network: {entry!r}") from None
    return tuple(networks)


def _address(text: str):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def client_address(peer: str, forwarded_for: Iterable[str], trusted: tuple[Network, ...]) -> str:
    """The visitor's address. The connection's, unless it comes from a trusted front
    proxy: then X-Forwarded-For is read from its end (each proxy appends the address it
    saw) past every trusted proxy, and the first address that is not one is the
    visitor's. What comes before it is the visitor's to forge, and is never read; an
    entry that is not an address stops the walk at the last trusted hop."""
    address = _address(peer)
    if address is None or not _trusted(address, trusted):
        return peer
    hops = [hop for value in forwarded_for for hop in value.split(",")]
    for hop in reversed(hops):
        seen = _address(hop)
        if seen is None:
            break
        address = seen
        if not _trusted(seen, trusted):
            break
    return str(address)


def _trusted(address, trusted: tuple[Network, ...]) -> bool:
    return any(address in network for network in trusted)


def attempts_key(address: str) -> str:
    """Whose sign-in attempts are counted together: an IPv4 address, or an IPv6
    address's /64 (one subscriber's, which it can fill with addresses at will)."""
    parsed = _address(address)
    if parsed is None:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)
