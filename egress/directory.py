"""What the proxy knows about sandboxes, loaded from PostgreSQL and kept fresh.

One background thread per proxy process reads the database; request threads only
read the in-memory snapshot (and ask for an early refresh when they meet an
unknown sandbox or token), so no request thread ever opens a database connection.
Apps are kept between refreshes: a refresh reads one fingerprint per App and loads
only the Apps that changed (an organization may have hundreds, each with dozens of
actions).
"""

import logging
import threading
import time
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from approvals.models import SessionGrant
from apps.policy import App, AppIndex, SessionApps
from apps.selectors import app_fingerprints, app_secrets, policy_apps
from egress.decisions import (
    SANDBOX_PRINCIPAL,
    SESSION_PRINCIPAL_PREFIX,
    CredentialRoute,
    EgressRules,
    SandboxContext,
)
from egress.models import EgressDomainRule
from quor.models import ModelProvider
from sandboxes.models import Sandbox, ScheduledRun, Session

logger = logging.getLogger(__name__)

PROVIDER_HEADERS = {
    ModelProvider.Kind.ANTHROPIC: "x-api-key",
    ModelProvider.Kind.OPENAI: "authorization",
    ModelProvider.Kind.OPENROUTER: "authorization",
}
SESSION_TOKEN_WINDOW = timedelta(days=7)
MIN_REFRESH_INTERVAL = 0.2


def url_endpoint(url: str) -> tuple[str, int, bool]:
    parts = urlsplit(url)
    https = parts.scheme == "https"
    return (parts.hostname or "").lower(), parts.port or (443 if https else 80), https


def egress_rules() -> EgressRules:
    host, port, _ = url_endpoint(settings.QUOR_SANDBOX_API_URL)
    allowlist = set()
    for entry in settings.QUOR_EGRESS_PRIVATE_ALLOWLIST:
        entry_host, _, entry_port = entry.rpartition(":")
        allowlist.add((entry_host.strip("[]").lower(), int(entry_port)))
    return EgressRules(
        control_plane=(host, port),
        private_allowlist=frozenset(allowlist),
        allowed_ports=frozenset(settings.QUOR_EGRESS_ALLOWED_PORTS),
    )


def _provider_routes(providers, user) -> list[CredentialRoute]:
    group_ids = {group.pk for group in user.groups.all()}
    routes = []
    for provider in providers:
        audience = {u.pk for u in provider.allowed_users.all()}
        groups = {g.pk for g in provider.allowed_groups.all()}
        if not (provider.available_to_everyone or user.pk in audience or group_ids & groups):
            continue
        host, port, https = url_endpoint(provider.effective_base_url)
        routes.append(
            CredentialRoute(
                kind=provider.kind,
                host=host,
                port=port,
                https=https,
                header=PROVIDER_HEADERS[provider.kind],
                secret=provider.api_key or None,
            )
        )
    return routes


class AppCache:
    """The organizations' enabled Apps, their indexes and their credentials, as of the
    last refresh. An organization's index is rebuilt only when one of its Apps was
    added, changed, disabled or deleted; an App is loaded only when it changed."""

    def __init__(self):
        self._fingerprints: dict[int, tuple[int, tuple]] = {}  # app id -> (org id, fingerprint)
        self._apps: dict[int, dict[int, App]] = {}  # org id -> app id -> App
        self._secrets: dict[int, dict[int | None, str]] = {}  # app id -> user id or None -> secret
        self._indexes: dict[int, AppIndex] = {}
        self._organization_credentials: dict[int, dict[int, tuple[str, str]]] = {}
        self._user_credentials: dict[int, dict[int, dict[int, tuple[str, str]]]] = {}

    def refresh(self, organization_ids) -> set[int]:
        """Brings these organizations' Apps up to date and forgets every other
        organization's; returns the ids of the Apps it loaded."""
        wanted = set(organization_ids)
        current = app_fingerprints(wanted)  # read first: a later change shows next time
        changed = {a for a, found in current.items() if self._fingerprints.get(a) != found}
        gone = self._fingerprints.keys() - current.keys()
        loaded = policy_apps(changed) if changed else {}
        secrets = app_secrets(changed) if changed else {}
        touched = set()
        for app_id in gone | changed:
            previous = self._fingerprints.pop(app_id, None)
            if previous is not None:
                self._apps[previous[0]].pop(app_id, None)
                touched.add(previous[0])
            self._secrets.pop(app_id, None)
        for app_id, app in loaded.items():  # a changed App disabled meanwhile is not here
            organization_id = current[app_id][0]
            self._fingerprints[app_id] = current[app_id]
            self._apps.setdefault(organization_id, {})[app_id] = app
            self._secrets[app_id] = secrets.get(app_id, {})
            touched.add(organization_id)
        for organization_id in self._indexes.keys() - wanted:
            self._forget(organization_id)
        for organization_id in (touched & wanted) | (wanted - self._indexes.keys()):
            self._rebuild(organization_id)
        return set(loaded)

    def _forget(self, organization_id: int) -> None:
        for table in (
            self._apps,
            self._indexes,
            self._organization_credentials,
            self._user_credentials,
        ):
            table.pop(organization_id, None)

    def _rebuild(self, organization_id: int) -> None:
        apps = self._apps.get(organization_id, {})
        self._indexes[organization_id] = AppIndex(apps.values())
        ours: dict[int, tuple[str, str]] = {}
        users: dict[int, dict[int, tuple[str, str]]] = {}
        for app_id in apps:
            for user_id, secret in self._secrets.get(app_id, {}).items():
                if not secret:
                    continue
                if user_id is None:
                    ours[app_id] = (secret, "organization")
                else:
                    users.setdefault(user_id, {})[app_id] = (secret, "user")
        self._organization_credentials[organization_id] = ours
        self._user_credentials[organization_id] = users

    def index(self, organization_id: int) -> AppIndex:
        return self._indexes[organization_id]

    def credentials(self, organization_id: int, user_id: int) -> dict[int, tuple[str, str]]:
        """App id -> (the credential this user gets, "user" or "organization"): the
        user's own, else the organization's."""
        ours = self._organization_credentials[organization_id]
        own = self._user_credentials[organization_id].get(user_id)
        return {**ours, **own} if own else ours


# Every App is loaded again this often, whatever the fingerprints say: a change made with
# `update()` (a shell, a data migration) moves no `updated_at` (docs/decisions.md).
FULL_RELOAD_EVERY_S = 60


class ContextLoader:
    """Loads every sandbox's context; keeps the Apps between loads (`AppCache`)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.apps = AppCache()
        self.apps_since = clock()

    def load(self) -> dict[str, SandboxContext]:
        """Every sandbox with a network address, keyed by that address."""
        sandboxes = list(
            Sandbox.objects.filter(network_address__isnull=False)
            .exclude(state=Sandbox.State.ABSENT)
            .select_related("user__membership__organization")
            .prefetch_related("user__groups")
        )
        organization_ids = {
            s.user.membership.organization_id for s in sandboxes if hasattr(s.user, "membership")
        }
        providers_by_org: dict[int, list] = {}
        for provider in ModelProvider.objects.filter(
            organization_id__in=organization_ids
        ).prefetch_related("allowed_users", "allowed_groups"):
            providers_by_org.setdefault(provider.organization_id, []).append(provider)
        rules_by_org: dict[int, dict[str, list[str]]] = {}
        for rule in EgressDomainRule.objects.filter(organization_id__in=organization_ids):
            rules_by_org.setdefault(rule.organization_id, {"allow": [], "deny": []})[
                rule.action
            ].append(rule.pattern.lower())
        recent_sessions = list(
            Session.objects.filter(
                sandbox__in=sandboxes, updated_at__gte=timezone.now() - SESSION_TOKEN_WINDOW
            ).only("id", "sandbox_id", "proxy_token")
        )
        session_apps = load_session_apps(recent_sessions)
        tokens_by_sandbox: dict = {}
        apps_by_sandbox: dict = {}
        for session in recent_sessions:
            tokens_by_sandbox.setdefault(session.sandbox_id, {})[
                f"{SESSION_PRINCIPAL_PREFIX}{session.pk}"
            ] = session.proxy_token
            apps_by_sandbox.setdefault(session.sandbox_id, {})[str(session.pk)] = session_apps[
                session.pk
            ]
        if self.clock() - self.apps_since >= FULL_RELOAD_EVERY_S:
            self.apps, self.apps_since = AppCache(), self.clock()
        try:
            self.apps.refresh(organization_ids)
        except Exception:  # half-refreshed: the next load starts from nothing
            self.apps, self.apps_since = AppCache(), self.clock()
            raise
        api_host, api_port, api_https = url_endpoint(settings.QUOR_SANDBOX_API_URL)

        contexts = {}
        for sandbox in sandboxes:
            membership = getattr(sandbox.user, "membership", None)
            if not (sandbox.user.is_active and membership and membership.organization.is_active):
                continue  # a deactivated user's sandbox, or a disabled organization's
            organization_id = membership.organization_id
            control_plane = CredentialRoute(
                kind="quor_api",
                host=api_host,
                port=api_port,
                https=api_https,
                header="authorization",
                secret=sandbox.runtime_credential or None,
            )
            rules = rules_by_org.get(organization_id, {"allow": [], "deny": []})
            contexts[sandbox.network_address] = SandboxContext(
                sandbox_id=str(sandbox.pk),
                user_id=sandbox.user_id,
                organization_id=organization_id,
                network_policy=sandbox.network_policy,
                placeholder=sandbox.placeholder,
                proxy_tokens={
                    SANDBOX_PRINCIPAL: sandbox.proxy_token,
                    **tokens_by_sandbox.get(sandbox.pk, {}),
                },
                routes=(
                    control_plane,
                    *_provider_routes(providers_by_org.get(organization_id, []), sandbox.user),
                ),
                domain_allow=tuple(rules["allow"]),
                domain_deny=tuple(rules["deny"]),
                apps=self.apps.index(organization_id),
                sessions=apps_by_sandbox.get(sandbox.pk, {}),
                app_credentials=self.apps.credentials(organization_id, sandbox.user_id),
            )
        return contexts


def load_contexts() -> dict[str, SandboxContext]:
    """Every sandbox's context, loaded once (`manage.py egress_check`)."""
    return ContextLoader().load()


def load_session_apps(sessions) -> dict:
    """Per session: the Apps it selected, its grants, and (during an unattended
    scheduled run) the Apps the task pre-approved."""
    ids = [session.pk for session in sessions]
    selected: dict = {pk: set() for pk in ids}
    for session_id, app_id in Session.apps.through.objects.filter(session_id__in=ids).values_list(
        "session_id", "app_id"
    ):
        selected[session_id].add(app_id)
    grants: dict = {pk: set() for pk in ids}
    for session_id, app_id, key in SessionGrant.objects.filter(session_id__in=ids).values_list(
        "session_id", "app_id", "action_key"
    ):
        grants[session_id].add((app_id, key))
    preapproved: dict = {}
    for run in ScheduledRun.objects.filter(
        session_id__in=ids, status=ScheduledRun.Status.RUNNING
    ).prefetch_related("task__preapproved_apps"):
        preapproved[run.session_id] = frozenset(a.pk for a in run.task.preapproved_apps.all())
    return {
        pk: SessionApps(
            selected=frozenset(selected[pk]),
            grants=frozenset(grants[pk]),
            preapproved=preapproved.get(pk),
        )
        for pk in ids
    }


class Directory:
    """The current snapshot of sandbox contexts, refreshed in the background."""

    def __init__(self, refresh_seconds: float = 2.0):
        self.refresh_seconds = refresh_seconds
        self._contexts: dict[str, SandboxContext] = {}
        self._loaded = threading.Event()
        self._wanted = threading.Event()
        self._refreshed = threading.Condition()
        self._generation = 0
        self._loader = ContextLoader()
        self.rules = egress_rules()

    @property
    def ready(self) -> bool:
        return self._loaded.is_set()

    def start(self) -> None:
        threading.Thread(target=self._run, name="egress-directory", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                close_old_connections()
                contexts = self._loader.load()
            except Exception:  # keep serving the last snapshot; never crash the proxy
                logger.exception("could not refresh the sandbox directory")
            else:
                with self._refreshed:
                    self._contexts = contexts
                    self._generation += 1
                    self._loaded.set()
                    self._refreshed.notify_all()
            time.sleep(MIN_REFRESH_INTERVAL)  # early refreshes cannot hammer the database
            self._wanted.wait(self.refresh_seconds)
            self._wanted.clear()

    def wait_until_ready(self, timeout: float) -> bool:
        return self._loaded.wait(timeout)

    def refresh_later(self) -> None:
        """Asks for a fresh snapshot without waiting for it."""
        self._wanted.set()

    def refresh_soon(self, timeout: float = 2.0) -> None:
        """Asks the background thread for a fresh snapshot and waits for it."""
        with self._refreshed:
            generation = self._generation
            self._wanted.set()
            self._refreshed.wait_for(lambda: self._generation > generation, timeout)

    def context_for(self, address: str) -> SandboxContext | None:
        return self._contexts.get(address)
