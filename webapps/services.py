"""Web apps: registering them, who may open them, and how a viewer gets from Quor's
origin to the app's own origin (a short-lived signed hand-off, then a cookie scoped to
that app's host only)."""

import functools
import logging
import re
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlencode, urlsplit

import redis
from django.conf import settings
from django.contrib.auth.hashers import check_password, make_password
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from quor.audit import audit_record, organization_of
from quor.lib import throttling
from quor.lib.errors import AccessDenied, InvalidInput, NotFound
from quor.lib.permissions import Permission, role_has
from quor.lib.tasks import send_on_commit
from sandboxes import image
from sandboxes.backends import get_backend
from sandboxes.backends.base import BackendError
from sandboxes.models import Sandbox, Session
from sandboxes.runtime.services import (
    sandbox_identity_environment,
    sandbox_touch,
    session_workspace,
)
from sandboxes.selectors import is_uuid
from sandboxes.sessions.events import session_events_append
from sandboxes.sessions.services import app_token_placeholders
from webapps import link_codes
from webapps.gate import HANDOFF_PATH
from webapps.models import PublicLink, PublicLinkVisit, WebApp

logger = logging.getLogger(__name__)

HANDOFF_SALT = "quor.webapps.handoff"
VIEWER_SALT = "quor.webapps.viewer"
HANDOFF_SECONDS = 60
VIEWER_COOKIE = "quor_webapp"
MAX_COMMAND_CHARS = 2000
# Opening an app of a sandbox in these states wakes it (a sleep under way ends first).
WAKING_STATES = (Sandbox.State.SNAPSHOTTING, Sandbox.State.SLEEPING, Sandbox.State.RESTORING)


@dataclass(frozen=True)
class AppOrigin:
    scheme: str
    base_host: str
    port: int | None

    def origin(self, label: str) -> str:
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{label}.{self.base_host}{port}"


def app_origin() -> AppOrigin:
    return _app_origin(settings.QUOR_WEBAPP_BASE_URL)


@functools.lru_cache(maxsize=8)
def _app_origin(base_url: str) -> AppOrigin:  # the proxy asks on every request
    parts = urlsplit(base_url)
    return AppOrigin(parts.scheme or "http", (parts.hostname or "localhost").lower(), parts.port)


def label_for_host(host_header: str) -> str | None:
    """The app label if this Host header names a web app's origin, else None."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return None
    host = host.rsplit(":", 1)[0] if ":" in host else host
    suffix = "." + app_origin().base_host
    if not host.endswith(suffix):
        return None
    label = host[: -len(suffix)]
    return label if label and "." not in label else None


# --- registering ----------------------------------------------------------------------------


def webapp_register(*, session: Session, port, command) -> WebApp:
    """The agent started a server on `port`: record it (again) as running and tell viewers."""

    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise InvalidInput("port must be a number from 1024 to 65535.", code="webapps.invalid_port")
    if port == image.EXEC_CHANNEL_PORT:
        raise InvalidInput(
            f"port {port} is Quor's own in the sandbox; serve the app on another port.",
            code="webapps.reserved_port",
        )
    if not isinstance(command, str) or not command.strip() or len(command) > MAX_COMMAND_CHARS:
        raise InvalidInput(
            f"command must be 1 to {MAX_COMMAND_CHARS} characters.", code="webapps.invalid_command"
        )
    with transaction.atomic():
        webapp, _ = WebApp.objects.update_or_create(
            session=session,
            port=port,
            defaults={"command": command, "status": WebApp.Status.RUNNING},
        )
        session_events_append(
            session=session, events=[("webapp_started", {"webapp": webapp_payload(webapp)})]
        )
    return webapp


def webapp_payload(webapp: WebApp) -> dict:
    return {
        "id": str(webapp.pk),
        "label": webapp.label,
        "port": webapp.port,
        "command": webapp.command,
        "status": webapp.status,
        "url": app_origin().origin(webapp.label) + "/",
        "open_url": f"/webapps/{webapp.label}/open",
        "view_url": f"/webapps/{webapp.label}/",
    }


# --- access ---------------------------------------------------------------------------------


def can_view(user, webapp: WebApp) -> bool:
    """Viewers of a web app: see may_view. Sharing exposes the app, nothing else of the
    session."""
    session = webapp.session
    return may_view(user, session.owner, session.sharing == Session.Sharing.ORGANIZATION)


def may_view(user, owner, shared_with_organization: bool) -> bool:
    """Viewers (of a web app or a relay tunnel) hold the web app permission in an active
    organization: the owner, and when shared, anyone of the owner's organization, while
    the owner is active."""
    if user is None or not user.is_active:
        return False
    mine = getattr(user, "membership", None)
    if mine is None or not mine.organization.is_active:
        return False
    if not role_has(mine.role, Permission.WEBAPP_VIEW):
        return False
    if not owner.is_active:
        return False  # a deactivated owner's apps end with their access
    if owner.pk == user.pk:
        return True
    owners = getattr(owner, "membership", None)
    return bool(
        shared_with_organization and owners and mine.organization_id == owners.organization_id
    )


def get_webapp_for_viewer(user, label: str) -> WebApp:
    webapp = (
        WebApp.objects.select_related(
            "session__owner__membership__organization", "session__sandbox"
        )
        .filter(label=label)
        .first()
    )
    if webapp is None or not can_view(user, webapp):
        raise NotFound("No such web app.", code="webapps.not_found")
    return webapp


def session_set_sharing(*, user, session: Session, sharing: str) -> Session:
    if session.owner_id != user.pk:
        raise NotFound("No such session.")
    return sharing_change(
        user=user, shared=session, sharing=sharing, error_code="webapps.invalid_sharing"
    )


def sharing_change(*, user, shared, sharing: str, error_code: str):
    """Sets who may view a session's web apps or a tunnel (both Session.Sharing), audited
    as `<model>.sharing_changed` when it changes."""
    if sharing not in Session.Sharing.values:
        raise InvalidInput(
            f"sharing must be one of {', '.join(Session.Sharing.values)}.", code=error_code
        )
    with transaction.atomic():
        type(shared).objects.filter(pk=shared.pk).update(sharing=sharing)
        if shared.sharing != sharing:
            audit_record(
                f"{shared._meta.model_name}.sharing_changed",
                target=shared,
                organization=organization_of(user),
                changes={"sharing": [shared.sharing, sharing]},
                actor=user,
            )
    shared.sharing = sharing
    return shared


# --- hand-off across origins --------------------------------------------------------------


def safe_next(path: str) -> str:
    """Only a path on the app's own origin (no scheme, no host, no `//`)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def handoff_url(user, webapp: WebApp, next_path: str = "/") -> str:
    """Where Quor's origin sends a viewer: the app's origin, with a token good for a
    minute that only this app accepts."""
    token = signing.dumps({"u": user.pk, "w": webapp.label}, salt=HANDOFF_SALT)
    query = urlencode({"token": token, "next": safe_next(next_path)})
    return f"{app_origin().origin(webapp.label)}{HANDOFF_PATH}?{query}"


def read_handoff(token: str, label: str) -> int | None:
    """The user id the hand-off carries, if it is valid, fresh and for this app."""
    try:
        data = signing.loads(token, salt=HANDOFF_SALT, max_age=HANDOFF_SECONDS)
    except signing.BadSignature:
        return None
    return data["u"] if data.get("w") == label else None


def viewer_cookie(user_id: int, label: str) -> str:
    return signing.dumps({"u": user_id, "w": label}, salt=VIEWER_SALT)


def login_url(label: str, next_path: str) -> str:
    """Quor's page that logs the viewer in (if needed) and hands them off to the app."""
    query = urlencode({"next": safe_next(next_path)})
    return f"{settings.QUOR_PUBLIC_URL.rstrip('/')}/webapps/{label}/open?{query}"


def viewer_url(label: str, next_path: str) -> str:
    """Quor's full-window page that frames the app (how a tab shows it)."""
    query = urlencode({"next": safe_next(next_path)})
    return f"{settings.QUOR_PUBLIC_URL.rstrip('/')}/webapps/{label}/?{query}"


def viewer_cookie_attributes(max_age: int | None = None) -> str:
    """Host-only (no Domain), HttpOnly. SameSite=None, so that it also travels from
    the preview iframe (an opaque origin); that needs Secure, which browsers accept
    over https and on *.localhost. Elsewhere over plain http: Lax (previews that load
    sub-resources may then ask to open the app in a tab)."""
    origin = app_origin()
    max_age = settings.QUOR_WEBAPP_COOKIE_SECONDS if max_age is None else max_age
    base = f"Path=/; HttpOnly; Max-Age={max_age}"
    if origin.scheme == "https" or origin.base_host == "localhost":
        # Partitioned (CHIPS): browsers that block third-party cookies keep it for the
        # preview inside Quor's page, and only there.
        return f"{base}; SameSite=None; Secure; Partitioned"
    return f"{base}; SameSite=Lax"


def read_viewer_cookie(value: str, label: str) -> int | None:
    try:
        data = signing.loads(value, salt=VIEWER_SALT, max_age=settings.QUOR_WEBAPP_COOKIE_SECONDS)
    except signing.BadSignature:
        return None
    return data["u"] if data.get("w") == label else None


def upstream_address(webapp: WebApp) -> tuple[str, int] | None:
    """Where the app server listens (the sandbox's bridge address), or None when the
    sandbox is not running."""
    sandbox = webapp.session.sandbox
    if sandbox.state != Sandbox.State.RUNNING or not sandbox.network_address:
        return None
    return sandbox.network_address, webapp.port


def webapp_opened(webapp: WebApp) -> bool:
    """A viewer is using the app: that is activity on its sandbox, and a sleeping
    sandbox wakes up. True while it is waking."""
    sandbox = webapp.session.sandbox
    if sandbox.state in WAKING_STATES:
        send_on_commit("sandboxes.tasks.ensure_sandbox", str(sandbox.pk))
        return True
    sandbox_touch(sandbox.pk)
    return False


def webapps_restart(sandbox: Sandbox) -> list[WebApp]:
    """After a wake: every running web app's command again, in its session's directory,
    with the session's proxy identity. A command that fails to start is logged; its app
    then answers 502 until the agent starts it again."""

    backend = get_backend(sandbox.backend)
    webapps = WebApp.objects.filter(session__sandbox=sandbox, status=WebApp.Status.RUNNING)
    for webapp in webapps.select_related("session"):
        session = webapp.session
        argv = image.restart_web_app_argv(webapp.command, webapp.port)
        env = {
            **sandbox_identity_environment(sandbox, session=session),
            **app_token_placeholders(session),
        }
        try:
            result = backend.exec(
                sandbox.backend_sandbox_id,
                argv,
                cwd=session_workspace(session),
                env=env,
                timeout_s=30,
                output_limit=4096,
            )
        except BackendError as exc:
            logger.warning("web app %s could not be started again: %s", webapp.label, exc)
            continue
        if result.exit_code != 0:
            problem = result.stderr.decode(errors="replace")[-300:]
            logger.warning("web app %s could not be started again: %s", webapp.label, problem)
    return list(webapps)


# --- public links ---------------------------------------------------------------------------
#
# A public link is its own origin (`p<hex>.<app base host>`): a visitor never shares an
# origin with Quor or with the app's private host, so no Quor cookie, session, file or
# event is within reach, and the proxy relays to the app with the same headers removed.

LINK_PREFIX = "p"
LINK_VISITOR_SALT = "quor.webapps.link-visitor"
LINK_COOKIE = "quor_link"
MIN_LINK_PASSWORD_CHARS = 8
MAX_LINK_PASSWORD_CHARS = 200
MAX_LINK_EMAIL_DOMAINS = 20
# A lowercase host name of two labels or more (letters, digits, hyphens; an IDN in its
# xn-- form); no wildcard: each domain is exactly that domain, subdomains are listed.
EMAIL_DOMAIN_PATTERN = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"
MAX_EMAIL_DOMAIN_CHARS = 253


def is_link_label(label: str) -> bool:
    return label.startswith(LINK_PREFIX)


def links_check_now() -> None:
    """Once the transaction commits, asks every web app proxy process to check its
    public links' open WebSockets at once, instead of at its next round: a link that
    ended closes them now. The message says nothing but "now" (each proxy reads the
    links afresh), so one sent by anyone else can only cause a check."""

    def publish():
        try:
            throttling.redis_client().publish(links_check_channel(), b"now")
        except redis.RedisError as error:  # the proxies' round closes them anyway
            logger.warning("could not ask the web app proxies to check links (%s)", error)

    transaction.on_commit(publish)


def links_check_channel() -> str:
    return f"quor:{settings.QUOR_DEPLOYMENT}:webapps:check-links"


def organization_set_public_links(*, actor, organization, allowed: bool) -> None:
    """An organization admin's switch. Off stops every link of the organization at the
    next request (the proxy reads it afresh); the links stay, and work again if it is
    turned back on before they expire."""
    with transaction.atomic():
        before = type(organization).objects.select_for_update().get(pk=organization.pk)
        if before.allow_public_links == allowed:
            return
        type(organization).objects.filter(pk=organization.pk).update(allow_public_links=allowed)
        if not allowed:
            links_check_now()
        audit_record(
            "organization.public_links_changed",
            target=organization,
            organization=organization,
            changes={"allow_public_links": [before.allow_public_links, allowed]},
            actor=actor,
        )


def session_set_confidential(*, actor, session: Session, confidential: bool) -> None:
    """An organization admin's mark: a confidential session's links stop at the next
    request and no new one can be made."""
    with transaction.atomic():
        before = Session.objects.select_for_update().get(pk=session.pk)
        if before.confidential == confidential:
            return
        Session.objects.filter(pk=session.pk).update(confidential=confidential)
        if confidential:
            links_check_now()
        audit_record(
            "session.confidential_changed",
            target=before,
            organization=organization_of(before.owner),
            changes={"confidential": [before.confidential, confidential]},
            actor=actor,
        )


def public_link_create(
    *,
    user,
    session: Session,
    webapp_id,
    expires_at,
    visitor_auth: str = PublicLink.VisitorAuth.NONE,
    password: str = "",
    email_domains: list[str] | None = None,
    requests_per_minute: int | None = None,
    bandwidth_bytes: int | None = None,
) -> PublicLink:
    """A link to one of the owner's web apps for people outside Quor, where the
    organization allows them and the session is not confidential."""
    if session.owner_id != user.pk:
        raise NotFound("No such session.")
    organization = organization_of(user)
    if organization is None or not organization.allow_public_links:
        raise AccessDenied(
            "Your organization does not allow public links to web apps.",
            code="webapps.public_links_not_allowed",
        )
    if session.confidential:
        raise AccessDenied(
            "An admin marked this session confidential: it cannot have public links.",
            code="webapps.session_confidential",
        )
    webapp = session.webapps.filter(pk=webapp_id).first() if is_uuid(str(webapp_id)) else None
    if webapp is None:
        raise NotFound("No such web app in this session.", code="webapps.not_found")
    now = timezone.now()
    longest = timedelta(days=settings.QUOR_PUBLIC_LINK_MAX_DAYS)
    if not now < expires_at <= now + longest:
        raise InvalidInput(
            f"expires_at must be in the future and at most {longest.days} days away.",
            code="webapps.invalid_link_expiry",
        )
    if visitor_auth == PublicLink.VisitorAuth.PASSWORD:
        if not MIN_LINK_PASSWORD_CHARS <= len(password) <= MAX_LINK_PASSWORD_CHARS:
            raise InvalidInput(
                f"A password link needs a password of {MIN_LINK_PASSWORD_CHARS} to "
                f"{MAX_LINK_PASSWORD_CHARS} characters.",
                code="webapps.invalid_link_password",
            )
    elif password:
        raise InvalidInput(
            "A password is only for links with visitor_auth `password`.",
            code="webapps.invalid_link_password",
        )
    email_domains = _email_domains(visitor_auth, email_domains or [])
    most_requests = settings.QUOR_PUBLIC_LINK_MAX_REQUESTS_PER_MINUTE
    requests_per_minute = _quota(requests_per_minute, most_requests, "requests_per_minute")
    bandwidth_bytes = _quota(
        bandwidth_bytes, settings.QUOR_PUBLIC_LINK_MAX_BANDWIDTH_BYTES, "bandwidth_bytes"
    )
    with transaction.atomic():
        link = PublicLink.objects.create(
            webapp=webapp,
            visitor_auth=visitor_auth,
            password_hash=make_password(password) if password else "",
            email_domains=email_domains,
            requests_per_minute=requests_per_minute,
            bandwidth_bytes=bandwidth_bytes,
            expires_at=expires_at,
            created_by=user,
        )
        audit_record(
            "public_link.created",
            target=link,
            organization=organization,
            changes={
                "webapp": webapp.label,
                "session": str(session.pk),
                "expires_at": expires_at.isoformat(),
                "visitor_auth": visitor_auth,
                "email_domains": email_domains,
                "requests_per_minute": requests_per_minute,
                "bandwidth_bytes": bandwidth_bytes,
            },
            actor=user,
        )
    return link


def _email_domains(visitor_auth: str, domains: list[str]) -> list[str]:
    """An email link's domains: 1 to MAX_LINK_EMAIL_DOMAINS lowercase host names, and
    mail to send its codes with; other links have none."""
    if visitor_auth != PublicLink.VisitorAuth.EMAIL:
        if domains:
            raise InvalidInput(
                "email_domains are only for links with visitor_auth `email`.",
                code="webapps.invalid_link_email_domains",
            )
        return []
    if not settings.EMAIL_HOST:
        raise InvalidInput(
            "This deployment sends no mail (QUOR_EMAIL_HOST is not set), so links restricted "
            "to email domains cannot be made.",
            code="webapps.email_not_configured",
        )
    shaped = all(
        isinstance(domain, str)
        and len(domain) <= MAX_EMAIL_DOMAIN_CHARS
        and re.fullmatch(EMAIL_DOMAIN_PATTERN, domain)
        for domain in domains
    )
    if not domains or len(domains) > MAX_LINK_EMAIL_DOMAINS or not shaped:
        raise InvalidInput(
            f"An email link needs 1 to {MAX_LINK_EMAIL_DOMAINS} email domains, each a lowercase "
            "host name such as example.com (no wildcard: list subdomains one by one).",
            code="webapps.invalid_link_email_domains",
        )
    return sorted(set(domains))


def _quota(value, most: int, name: str) -> int:
    if value is None:
        return most
    if not 1 <= value <= most:
        raise InvalidInput(f"{name} must be from 1 to {most}.", code="webapps.invalid_link_quota")
    return value


def public_link_revoke(*, user, link: PublicLink) -> None:
    """Ends the link (its owner through the API, an organization admin in the admin
    site): the proxy reads the link on each visitor request, so the next request is
    refused, and the link's open WebSockets close at once (links_check_now)."""
    with transaction.atomic():
        revoked = PublicLink.objects.filter(pk=link.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if revoked:
            links_check_now()
            audit_record(
                "public_link.revoked",
                target=link,
                organization=organization_of(link.webapp.session.owner),
                changes={"webapp": link.webapp.label},
                actor=user,
            )


def public_link_payload(link: PublicLink) -> dict:
    return {
        "id": str(link.pk),
        "webapp": str(link.webapp_id),
        "url": app_origin().origin(link.label) + "/",
        "visitor_auth": link.visitor_auth,
        "email_domains": link.email_domains,
        "requests_per_minute": link.requests_per_minute,
        "bandwidth_bytes": link.bandwidth_bytes,
        "expires_at": link.expires_at,
        "created_at": link.created_at,
    }


def public_link_for_visitor(label: str) -> PublicLink | None:
    """The link of this host label if visitors may use it now: not revoked or expired,
    its organization (still) allows public links, its session is not confidential, its
    owner still uses Sandbox in an active organization. Read afresh on every request, so
    that each of these takes effect at once."""
    link = (
        PublicLink.objects.select_related(
            "webapp__session__owner__membership__organization", "webapp__session__sandbox"
        )
        .filter(label=label, revoked_at__isnull=True, expires_at__gt=timezone.now())
        .first()
    )
    if link is None:
        return None
    session = link.webapp.session
    owners = getattr(session.owner, "membership", None)
    usable = (
        not session.confidential
        and session.owner.is_active
        and owners is not None
        and owners.organization.is_active
        and owners.organization.allow_public_links
        and role_has(owners.role, Permission.SANDBOX_USE)
    )
    return link if usable else None


def public_link_password_matches(link: PublicLink, password: str) -> bool:
    return bool(link.password_hash) and check_password(password, link.password_hash)


def visitor_email(typed: str) -> str | None:
    """The address an email link's visitor typed, lowercased, if it is one; a domain
    typed in Unicode in its xn-- form, as the link's domains are given."""
    email = typed.strip().lower()
    try:
        validate_email(email)
        local, _, domain = email.rpartition("@")
        return f"{local}@{domain.encode('idna').decode('ascii')}"
    except (ValidationError, UnicodeError):
        return None


def email_may_open(link: PublicLink, email: str) -> bool:
    """Exactly one of the link's domains: `example.com` admits no `a.example.com`."""
    return email.rpartition("@")[2] in link.email_domains


def public_link_code_mail(*, link: PublicLink, email: str, code: str) -> None:
    """Mails the one-time code (blocking: the proxy calls it on a thread of its own)."""
    url = app_origin().origin(link.label) + "/"
    minutes = link_codes.CODE_SECONDS // 60
    body = (
        f"Your code to open {url} is {code}\n\n"
        f"It works once, within {minutes} minutes. If you did not ask for it, ignore this "
        "mail: nobody gets in without the code.\n"
    )
    send_mail(f"Your code: {code}", body, None, [email])


def public_link_visit_record(
    *,
    link: PublicLink,
    address: str | None,
    user_agent: str,
    authenticated_by: str,
    email: str = "",
) -> PublicLinkVisit:
    return PublicLinkVisit.objects.create(
        link=link,
        address=address,
        user_agent=user_agent[:300],
        authenticated_by=authenticated_by,
        email=email,
    )


def link_visitor_cookie(link: PublicLink, email: str = "") -> str:
    """What the visitor's browser keeps: the link and how the visitor got in (with an
    email link, the address). Another link, or the app's private host, does not accept
    it."""
    data = {"l": link.label, "a": link.visitor_auth}
    if email:
        data["e"] = email
    value = signing.dumps(data, salt=LINK_VISITOR_SALT)
    seconds = max(0, int((link.expires_at - timezone.now()).total_seconds()))
    return f"{LINK_COOKIE}={value}; {viewer_cookie_attributes(seconds)}"


def link_visitor_admitted(value: str, link: PublicLink) -> bool:
    try:
        data = signing.loads(
            value,
            salt=LINK_VISITOR_SALT,
            max_age=timedelta(days=settings.QUOR_PUBLIC_LINK_MAX_DAYS),
        )
    except signing.BadSignature:
        return False
    return data.get("l") == link.label and data.get("a") == link.visitor_auth
