"""Which App a request goes to, which of its actions it is, and what the policy says.

Pure functions over plain data (an import contract keeps Django out): the egress
proxy, `manage.py egress_check`, the API and the table-driven tests all call the
same code. Apps are indexed by host, so the cost of deciding a request does not
grow with the number of Apps an organization has.
"""

import base64
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote

AUTO = "auto"
ASK = "ask"
DENY = "deny"
POLICIES = (AUTO, ASK, DENY)
STRICTNESS = {AUTO: 0, ASK: 1, DENY: 2}

# Requests that match no cataloged action of a built-in App, and every request to a
# custom App, are this synthetic action: Ask.
UNCATALOGED = "uncataloged"
ANY_REQUEST = "any"

# Outcomes of deciding a request.
FORWARD = "forward"  # not an App request, or an App not selected: no credential
CREDENTIAL = "credential"  # forward with the App's credential
PARK = "park"  # wait for the session owner's approval
REFUSE = "refuse"  # 403 at once

CREDENTIAL_STYLES = ("bearer", "basic", "header")


class InvalidPattern(ValueError):
    pass


class NonCanonicalPath(ValueError):
    """A path that could mean something else upstream (dot segments, encoded slashes)."""


# --- patterns -------------------------------------------------------------------------------

_PARAMETER = re.compile(r"^\{[A-Za-z_][A-Za-z0-9_]*\}$")
_LITERAL = re.compile(r"^[A-Za-z0-9._~!$&'()+,;=:@-]+$")


@functools.lru_cache(maxsize=65536)
def compile_path_pattern(pattern: str) -> re.Pattern:
    """`/repos/{owner}/{repo}/contents/**`: `{name}` is one path segment, a final `/**`
    is any rest of the path (or none). Matching ignores case and a trailing slash."""
    if not pattern.startswith("/"):
        raise InvalidPattern(f"{pattern!r}: a path pattern starts with /")
    segments = pattern.strip("/").split("/") if pattern != "/" else []
    tail = ""
    if segments and segments[-1] == "**":
        segments.pop()
        tail = "(?:/.*)?"
    parts = []
    for segment in segments:
        if _PARAMETER.match(segment):
            parts.append("/[^/]+")
        elif _LITERAL.match(segment):
            parts.append("/" + re.escape(segment))
        else:
            raise InvalidPattern(
                f"{pattern!r}: segment {segment!r} must be literal or {{name}}; "
                "** is allowed only at the end"
            )
    return re.compile("^" + "".join(parts) + tail + "/?$", re.IGNORECASE)


@dataclass(frozen=True)
class UrlPattern:
    """`https://api.github.com`, `https://*.atlassian.net`, `https://git.example.com/api/v3`."""

    scheme: str
    host: str  # exact, or "*.suffix"
    port: int
    base_path: str  # "" or "/api/v3" (no trailing slash)

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")

    def __str__(self):
        default = 443 if self.scheme == "https" else 80
        port = "" if self.port == default else f":{self.port}"
        return f"{self.scheme}://{self.host}{port}{self.base_path}"


_HOST = re.compile(r"^(\*\.)?([a-z0-9-]+\.)*[a-z0-9-]+$|^\[[0-9a-f:.]+\]$|^[0-9.]+$")


def parse_url_pattern(text: str) -> UrlPattern:
    scheme, sep, rest = text.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise InvalidPattern(f"{text!r}: must start with https:// or http://")
    authority, slash, path = rest.partition("/")
    host, port = authority.lower(), 443 if scheme == "https" else 80
    if not host.endswith("]") and ":" in host:
        host, _, port_text = host.rpartition(":")
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise InvalidPattern(f"{text!r}: invalid port")
        port = int(port_text)
    if not _HOST.match(host):
        raise InvalidPattern(f"{text!r}: the host must be a name, an address or *.domain")
    base_path = ("/" + path).rstrip("/") if slash else ""
    if any(c in base_path for c in "*?{}#") or "//" in base_path:
        raise InvalidPattern(f"{text!r}: the path part must be a plain prefix")
    return UrlPattern(scheme, host, port, base_path)


def canonical_path(target: str) -> str:
    """The request path as the upstream will understand it, or NonCanonicalPath.

    Percent-escapes are decoded once (an App decodes them too); encoded slashes, dot
    segments and empty segments are refused rather than guessed at, so no spelling
    of a path can slip past the action it is."""
    path = target.split("?", 1)[0].split("#", 1)[0] or "/"
    if not path.startswith("/"):
        raise NonCanonicalPath("the request path must start with /")
    if ";" in path or "%3b" in path.lower():
        raise NonCanonicalPath("path parameters (;) are not accepted in App requests")
    lowered = path.lower()
    if "%2f" in lowered or "%5c" in lowered or "\\" in path:
        raise NonCanonicalPath("encoded slashes are not accepted in App requests")
    decoded = unquote(path)
    segments = decoded.split("/")[1:]
    if segments and segments[-1] == "":
        segments.pop()
    if any(segment in ("", ".", "..") for segment in segments):
        raise NonCanonicalPath("dot segments and empty segments are not accepted")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in decoded):
        raise NonCanonicalPath("control characters are not accepted")
    return decoded


# --- Apps, actions, sessions ------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    key: str
    name: str
    policy: str
    methods: frozenset[str] = frozenset()  # empty: any method
    paths: tuple[str, ...] = ()
    _regexes: tuple[re.Pattern, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def build(cls, key, name, policy, methods=(), paths=()):
        if policy not in POLICIES:
            raise InvalidPattern(f"{key}: unknown policy {policy!r}")
        return cls(
            key=key,
            name=name,
            policy=policy,
            methods=frozenset(m.upper() for m in methods),
            paths=tuple(paths),
            _regexes=tuple(compile_path_pattern(p) for p in paths),
        )

    def matches(self, method: str, path: str) -> bool:
        if self.methods and method not in self.methods:
            return False
        return any(regex.match(path) for regex in self._regexes)


@dataclass(frozen=True)
class App:
    app_id: int
    name: str
    url_patterns: tuple[UrlPattern, ...]
    actions: tuple[Action, ...] = ()
    custom: bool = False
    deny_when_not_selected: bool = False
    credential_style: str = "bearer"
    credential_header: str = "authorization"  # lowercase


@dataclass(frozen=True)
class SessionApps:
    """What one session may do with Apps.

    `preapproved` is None while a person can answer (an interactive session); during
    an unattended scheduled run it is the set of Apps the task pre-approved."""

    selected: frozenset[int] = frozenset()
    grants: frozenset[tuple[int, str]] = frozenset()  # (app id, action key)
    preapproved: frozenset[int] | None = None


@dataclass(frozen=True)
class AppDecision:
    outcome: str  # FORWARD, CREDENTIAL, PARK, REFUSE
    reason: str  # a stable code: why
    app: App | None = None
    actions: tuple[Action, ...] = ()  # matched, strictest first
    policy: str | None = None

    @property
    def ask_keys(self) -> frozenset[str]:
        """The actions an approval "for this session" covers."""
        return frozenset(a.key for a in self.actions if a.policy == ASK)


class AppIndex:
    """An organization's enabled Apps, indexed by (host, port) and wildcard suffix."""

    def __init__(self, apps: Iterable[App] = ()):
        self.apps: dict[int, App] = {}
        self._exact: dict[tuple[str, int], list[tuple[UrlPattern, App]]] = {}
        self._suffix: dict[tuple[str, int], list[tuple[UrlPattern, App]]] = {}
        for app in sorted(apps, key=lambda a: a.app_id):
            self.apps[app.app_id] = app
            for pattern in app.url_patterns:
                if pattern.wildcard:
                    table, host = self._suffix, pattern.host[2:]
                else:
                    table, host = self._exact, pattern.host
                table.setdefault((host, pattern.port), []).append((pattern, app))

    def __len__(self):
        return len(self.apps)

    def _candidates(self, host: str, port: int) -> list[tuple[UrlPattern, App]]:
        found = list(self._exact.get((host, port), ()))
        labels = host.split(".")
        for i in range(1, len(labels)):
            found.extend(self._suffix.get((".".join(labels[i:]), port), ()))
        return found

    def serves(self, host: str, port: int) -> bool:
        """Whether any App lives at this host: its HTTPS traffic must be intercepted."""
        return bool(self._candidates(host, port))

    def app_at(self, scheme: str, host: str, port: int) -> App | None:
        """An App (the first created) with a URL pattern at this scheme, host and port."""
        apps = [app for pattern, app in self._candidates(host, port) if pattern.scheme == scheme]
        return min(apps, key=lambda app: app.app_id, default=None)

    def attribute(self, scheme: str, host: str, port: int, path: str) -> tuple[App, str] | None:
        """The App the URL belongs to and the path relative to its base path. The
        longest base path wins; between equals, the App created first."""
        best = None
        for pattern, app in self._candidates(host, port):
            if pattern.scheme != scheme:
                continue
            base = pattern.base_path
            if base and not (
                path.lower() == base.lower() or path.lower().startswith(base.lower() + "/")
            ):
                continue
            rank = (len(base), -app.app_id)
            if best is None or rank > best[0]:
                best = (rank, app, path[len(base) :] or "/")
        return None if best is None else (best[1], best[2])


def _synthetic(app: App) -> Action:
    if app.custom:
        return Action(ANY_REQUEST, f"Any request to {app.name}", ASK)
    return Action(UNCATALOGED, f"A request outside {app.name}'s catalog", ASK)


def match_actions(app: App, method: str, path: str) -> tuple[Action, ...]:
    """The actions the request is, strictest first; never empty."""
    method = "GET" if method == "HEAD" else method
    matched = [a for a in app.actions if a.matches(method, path)]
    if not matched:
        return (_synthetic(app),)
    return tuple(sorted(matched, key=lambda a: -STRICTNESS[a.policy]))


def decide_app_request(
    index: AppIndex,
    session: SessionApps | None,
    *,
    method: str,
    scheme: str,
    host: str,
    port: int,
    target: str,
) -> AppDecision:
    """The whole precedence, in order:

    1. A URL no enabled App owns is an ordinary request (FORWARD).
    2. The strictest matched action governs: Deny, then Ask, then Auto-approve; a
       request matching no cataloged action (or any custom App request) is Ask.
    3. Deny refuses, whatever else holds (session selection, grants, pre-approval).
    4. An App not selected for the session is not credentialed: forwarded bare, or
       refused if the App says so.
    5. Auto-approve is credentialed.
    6. Ask: a session grant covering every Ask action, or, in an unattended run, the
       task's pre-approval of the App, lets it through; an unattended run without
       pre-approval is refused at once (nobody can answer); otherwise it parks.
    """
    method = method.upper()
    try:
        path = canonical_path(target)
    except NonCanonicalPath:
        path = None
    if path is None:
        # Judged by the host alone: /api//chat.delete is not under Slack's base path
        # /api as written, yet upstream may well resolve it to /api/chat.delete.
        app = index.app_at(scheme, host, port)
        if app is None:
            return AppDecision(FORWARD, "no_app")
        return AppDecision(REFUSE, "apps.noncanonical_path", app)
    attributed = index.attribute(scheme, host, port, path)
    if attributed is None:
        return AppDecision(FORWARD, "no_app")
    app, relative = attributed
    actions = match_actions(app, method, relative)
    policy = actions[0].policy
    if policy == DENY:
        return AppDecision(REFUSE, "apps.action_denied", app, actions, policy)
    if session is None or app.app_id not in session.selected:
        if app.deny_when_not_selected:
            return AppDecision(REFUSE, "apps.not_selected", app, actions, policy)
        return AppDecision(FORWARD, "not_selected", app, actions, policy)
    if policy == AUTO:
        return AppDecision(CREDENTIAL, "auto_approved", app, actions, policy)
    decision = AppDecision(PARK, "ask", app, actions, policy)
    if all((app.app_id, key) in session.grants for key in decision.ask_keys):
        return AppDecision(CREDENTIAL, "session_grant", app, actions, policy)
    if session.preapproved is not None:
        if app.app_id in session.preapproved:
            return AppDecision(CREDENTIAL, "preapproved", app, actions, policy)
        return AppDecision(REFUSE, "apps.nobody_to_ask", app, actions, policy)
    return decision


def credential_headers(app: App, secret: str) -> dict[str, str]:
    """The header (lowercase name) that carries the App's credential."""
    if app.credential_style == "bearer":
        return {"authorization": f"Bearer {secret}"}
    if app.credential_style == "basic":
        return {"authorization": "Basic " + base64.b64encode(secret.encode()).decode()}
    return {app.credential_header: secret}
