"""Single sign-on with OpenID Connect, per organization (SingleSignOn).

The protocol is Authlib's: the authorization code flow with PKCE (S256), `state` and
`nonce` kept in the browser's session, the ID token's signature checked against the
provider's JWKS (fetched again when a token names a key it does not have, so the
provider may rotate keys), and its issuer, audience, expiry and nonce checked. What is
Quor's own is here: which organization a sign-in is for, how claims become a member
(email, name, role, groups), who may not sign in, and the audit of each sign-in and
each refusal.

A state is used once: the callback removes it from the session before anything else,
so a replayed callback (or an ID token replayed with it) finds nothing and is refused.
"""

import hashlib
import ipaddress
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import redis
import requests
from authlib.integrations.base_client import OAuthError
from authlib.integrations.django_client import OAuth
from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.models import Group as DjangoGroup
from django.db import IntegrityError, transaction
from django.urls import reverse
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry, extract_compact
from joserfc.jwt import JWTClaimsRegistry

from quor import email_domains
from quor.audit import audit_record
from quor.lib.permissions import Role
from quor.lib.throttling import redis_client
from quor.models import Membership, Organization, OrganizationGroup, SingleSignOn, User
from quor.services import login_sessions_end

logger = logging.getLogger(__name__)

PENDING_KEY = "quor_sso_pending"
"""Session key: {state: {"organization": id, "next": path}} of sign-ins under way."""
SIGNED_IN_KEY = "quor_sso"
"""Session key: the organization and ID token of an SSO sign-in, for logout."""

SIGNING_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                      "ES512", "EdDSA"]  # fmt: skip
"""Asymmetric only: an ID token signed with `none` or with the client secret is refused."""
ROLES_FROM_CLAIM = {Role.ADMIN, Role.MEMBER, Role.AUDITOR}
HTTP_TIMEOUT_SECONDS = 10
METADATA_MAX_AGE_SECONDS = 3600
PENDING_MAX = 5
"""Sign-ins under way per browser session: enough for a few tabs, not a growing list."""
PENDING_MAX_AGE_SECONDS = 600


class SignInRefused(Exception):
    """A sign-in that cannot go on: what to tell the person, and for the audit log the
    reason and its details."""

    def __init__(self, reason: str, message: str, *, status: int = 400, details=None):
        self.reason = reason
        self.message = message
        self.status = status
        self.details = details or {}
        super().__init__(message)


@dataclass(frozen=True)
class _CachedClient:
    client: object
    version: tuple
    loaded_at: float


_clients: dict[int, _CachedClient] = {}
_clients_lock = threading.Lock()


def issuer_is_allowed(issuer: str) -> bool:
    """HTTPS; plain HTTP only to loopback where `QUOR_SSO_ALLOW_LOOPBACK` allows it."""
    parts = urlsplit(issuer)
    if parts.scheme == "https":
        return bool(parts.hostname)
    return (
        settings.QUOR_SSO_ALLOW_LOOPBACK
        and parts.scheme == "http"
        and parts.hostname in {"127.0.0.1", "localhost", "::1"}
    )


def _check_reachable_address(url: str) -> None:
    """The web tier fetches the provider's URLs itself: each must resolve to public
    addresses only (no private, loopback or link-local network, where an owner could aim
    it inward), loopback alone when `QUOR_SSO_ALLOW_LOOPBACK` says so."""
    parts = urlsplit(url)
    if not issuer_is_allowed(f"{parts.scheme}://{parts.netloc}"):
        raise _misconfigured("an endpoint is not an https:// address")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise _unreachable() from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not (address.is_global or (settings.QUOR_SSO_ALLOW_LOOPBACK and address.is_loopback)):
            raise _misconfigured("an endpoint is on a private network")


def _unreachable() -> SignInRefused:
    return SignInRefused(
        "provider_unreachable",
        "Your organization's identity provider could not be reached. Try again in a "
        "moment, or ask your administrator.",
        status=502,
    )


def _misconfigured(why: str) -> SignInRefused:
    logger.warning("sso: provider refused: %s", why)
    return SignInRefused(
        "provider_misconfigured",
        f"Your organization's identity provider is not configured correctly ({why}). Ask "
        "your administrator.",
        status=502,
    )


def _client_for(sso: SingleSignOn):
    """One Authlib client per organization and process, remade when the configuration
    changes or its discovery document is an hour old."""
    version = (sso.issuer, sso.client_id, sso.client_secret, sso.scopes, sso.updated_at)
    with _clients_lock:
        cached = _clients.get(sso.organization_id)
        if (
            cached is not None
            and cached.version == version
            and time.monotonic() - cached.loaded_at < METADATA_MAX_AGE_SECONDS
        ):
            return cached.client
        client = OAuth().register(
            name=f"organization-{sso.organization_id}",
            client_id=sso.client_id,
            client_secret=sso.client_secret,
            server_metadata_url=sso.issuer.rstrip("/") + "/.well-known/openid-configuration",
            client_kwargs={
                "scope": sso.scopes,
                "code_challenge_method": "S256",
                "default_timeout": HTTP_TIMEOUT_SECONDS,
            },
        )
        _clients[sso.organization_id] = _CachedClient(client, version, time.monotonic())
        return client


def _provider_metadata(client, sso: SingleSignOn) -> dict:
    """The discovery document, after checking it is the configured issuer's (OpenID
    Connect Discovery 1.0, section 4.3) and keeping only asymmetric signing algorithms."""
    _check_reachable_address(sso.issuer)
    try:
        metadata = client.load_server_metadata()
    except (requests.RequestException, ValueError) as exc:
        logger.warning("sso: discovery of %s failed: %s", sso.issuer, exc)
        raise _unreachable() from None
    if metadata.get("issuer") != sso.issuer:
        raise SignInRefused(
            "issuer_mismatch",
            "Your organization's identity provider is not configured correctly (its "
            "discovery document names another issuer). Ask your administrator.",
            status=502,
        )
    offered = metadata.setdefault(
        "quor_offered_algorithms",
        metadata.get("id_token_signing_alg_values_supported") or ["RS256"],
    )
    algorithms = [alg for alg in offered if alg in SIGNING_ALGORITHMS]
    if not algorithms:
        raise _misconfigured("it signs ID tokens with no asymmetric algorithm")
    metadata["id_token_signing_alg_values_supported"] = algorithms
    for endpoint in ("token_endpoint", "jwks_uri", "userinfo_endpoint"):
        if metadata.get(endpoint):
            _check_reachable_address(metadata[endpoint])
    for endpoint in ("authorization_endpoint", "end_session_endpoint"):
        if metadata.get(endpoint) and urlsplit(metadata[endpoint]).scheme not in {"https", "http"}:
            raise _misconfigured(f"its {endpoint} is not a web address")
    return metadata


def single_sign_on_for(slug: str) -> SingleSignOn:
    sso = (
        SingleSignOn.objects.select_related("organization")
        .filter(organization__slug=slug.strip().lower(), enabled=True)
        .first()
    )
    if sso is None or not sso.organization.is_active:
        raise SignInRefused(
            "not_configured",
            "This organization has no single sign-on. Check its name, or log in with "
            "your email and password.",
            status=404,
        )
    if not issuer_is_allowed(sso.issuer):
        raise SignInRefused(
            "issuer_not_https",
            "Your organization's identity provider is not configured correctly (its "
            "issuer must use HTTPS). Ask your administrator.",
            status=502,
        )
    return sso


def sign_in_start(request, sso: SingleSignOn, next_path: str) -> str:
    """The identity provider's authorization URL for this browser, remembering in the
    session which organization this sign-in is for and where to go after it."""
    client = _client_for(sso)
    _provider_metadata(client, sso)
    redirect_uri = request.build_absolute_uri(reverse("sso-callback"))
    provider_url = client.authorize_redirect(request, redirect_uri)["Location"]
    state = _state_of(provider_url)
    pending = {
        old_state: started
        for old_state, started in request.session.get(PENDING_KEY, {}).items()
        if started.get("at", 0) > time.time() - PENDING_MAX_AGE_SECONDS
    }
    while len(pending) >= PENDING_MAX:
        pending.pop(next(iter(pending)))
    pending[state] = {"organization": sso.organization_id, "next": next_path, "at": time.time()}
    authlib_states = [key for key, _ in request.session.items() if key.startswith("_state_")]
    for key in authlib_states:
        if key.rsplit("_", 1)[-1] not in pending:
            del request.session[key]  # Authlib's data of a sign-in no longer pending
    request.session[PENDING_KEY] = pending
    return provider_url


def _state_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["state"][0]


def sign_in_complete(request) -> tuple[User, str]:
    """Ends a sign-in the identity provider sent back: the member signed in, and where to
    go. A refusal raises SignInRefused, after it is in the audit log; nothing is created
    or changed unless every check has passed."""
    try:
        sso, user, next_path, id_token, session_id = _sign_in_checked(request)
    except SignInRefused as refusal:
        logger.info("sso: sign-in refused (%s)", refusal.reason)
        audit_record(
            "sso.refused",
            organization=refusal.details.pop("organization", None),
            changes={"reason": refusal.reason, **refusal.details},
        )
        raise
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    request.session[SIGNED_IN_KEY] = {
        "organization": sso.organization_id,
        "id_token": id_token,
        "sid": session_id,
    }
    return user, next_path


def _sign_in_checked(request):
    state = request.GET.get("state", "")
    pending = request.session.get(PENDING_KEY, {})
    started = pending.pop(state, None)
    request.session[PENDING_KEY] = pending
    if started is None or started.get("at", 0) < time.time() - PENDING_MAX_AGE_SECONDS:
        raise _refused(
            None,
            "unknown_state",
            "This sign-in has expired or was already used. Start again from the login page.",
        )
    sso = (
        SingleSignOn.objects.select_related("organization")
        .filter(organization_id=started["organization"], enabled=True)
        .first()
    )
    if sso is None or not sso.organization.is_active:
        raise _refused(None, "not_configured", "Single sign-on is no longer enabled here.")
    if request.GET.get("error"):
        raise _refused(
            sso,
            "provider_error",
            "Your identity provider did not sign you in "
            f"({request.GET.get('error_description') or request.GET['error']}).",
            status=403,
            details={"error": request.GET["error"][:100]},
        )
    claims, id_token = _verified_claims(request, sso)
    return sso, _member_for(sso, claims), started["next"], id_token, claims.get("sid")


def _verified_claims(request, sso: SingleSignOn) -> tuple[dict, str]:
    client = _client_for(sso)
    _provider_metadata(client, sso)
    try:
        token = client.authorize_access_token(
            request,
            claims_options={
                "iss": {"essential": True, "values": [sso.issuer]},
                "aud": {"essential": True, "values": [sso.client_id]},
            },
        )
    except OAuthError as exc:
        raise _refused(
            sso,
            "token_refused",
            "Your identity provider refused to complete the sign-in. Start again.",
            details={"error": exc.error, "description": (exc.description or "")[:200]},
        ) from None
    except JoseError as exc:
        raise _refused(
            sso,
            "id_token_invalid",
            "The identity provider's answer could not be verified, so you were not "
            "signed in. Start again, or ask your administrator.",
            details={"error": exc.error, "description": (exc.description or "")[:200]},
        ) from None
    except requests.RequestException as exc:
        logger.warning("sso: token request to %s failed: %s", sso.issuer, exc)
        raise _refused(
            sso,
            "provider_unreachable",
            "Your organization's identity provider could not be reached. Try again.",
            status=502,
        ) from None
    id_token_claims = dict(token.get("userinfo") or {})
    if not id_token_claims:
        raise _refused(sso, "id_token_missing", "The identity provider sent no ID token.")
    userinfo = _userinfo_claims(client, sso, token, id_token_claims["sub"])
    return {**userinfo, **id_token_claims}, token["id_token"]


def _userinfo_claims(client, sso: SingleSignOn, token: dict, subject: str) -> dict:
    """The UserInfo endpoint's claims the ID token does not carry (many providers keep
    email or groups there); the ID token's own claims win."""
    if not client.load_server_metadata().get("userinfo_endpoint"):
        return {}
    try:
        userinfo = client.userinfo(token=token)
    except (requests.RequestException, OAuthError, ValueError) as exc:
        logger.warning("sso: userinfo of %s failed: %s", sso.issuer, exc)
        return {}
    if userinfo.get("sub") != subject:
        raise _refused(sso, "userinfo_mismatch", "The identity provider's answers disagree.")
    return {name: value for name, value in userinfo.items() if name not in {"sub"}}


def _claim(claims: dict, name: str):
    return claims.get(name) if name else None


def _member_for(sso: SingleSignOn, claims: dict) -> User:
    """The member these claims name, after every check; created when allowed. Role and
    groups follow the claims that carry them."""
    email = _claim(claims, sso.email_claim)
    if not isinstance(email, str) or "@" not in email:
        raise _refused(
            sso,
            "no_email",
            "Your identity provider did not say your email address, so Quor cannot tell "
            "who you are. Ask your administrator.",
            details={"claim": sso.email_claim},
        )
    email = email.strip().lower()
    if sso.require_verified_email and claims.get("email_verified") is not True:
        raise _refused(
            sso,
            "email_not_verified",
            "Your identity provider does not say that your email address is verified.",
            status=403,
            details={"email": email},
        )
    role = _role_from(sso, claims)
    group_names = _groups_from(sso, claims)
    with transaction.atomic():
        user = User.objects.select_for_update().filter(email__iexact=email).first()
        membership = Membership.objects.filter(user=user).first() if user is not None else None
        if membership is None or membership.organization_id != sso.organization_id:
            user, membership = _newcomer(sso, email, claims, role, existing=user)
        if user.is_superuser or user.is_staff or hasattr(user, "service_account"):
            raise _refused(
                sso,
                "not_a_person_of_the_organization",
                "This account cannot sign in through your organization's identity provider.",
                status=403,
                details={"email": email},
            )
        _check_subject(sso, membership, claims)
        if not user.is_active:
            raise _refused(
                sso,
                "deactivated",
                "Your account is deactivated. Ask your administrator.",
                status=403,
                details={"email": email},
            )
        changes = _apply_claims(sso, user, membership, claims, role, group_names)
        audit_record(
            "sso.login",
            target=membership,
            organization=sso.organization,
            actor=user,
            changes={"issuer": sso.issuer, "subject": str(claims.get("sub")), **changes},
        )
    return user


def _newcomer(sso: SingleSignOn, email: str, claims: dict, role, existing: User | None):
    """Someone who is not a member yet: created when the organization creates users and
    holds the address's domain verified. Outside its verified domains the refusal is the
    same whether another organization has the address or nobody does; inside them the
    domain is the organization's own, and an address another organization took is said
    to be taken."""
    if not (sso.creates_users and email_domains.domain_is_verified(sso.organization, email)):
        raise _refused(
            sso,
            "no_account",
            f"{email} is not a member of {sso.organization.name}. Ask your "
            "administrator to add you.",
            status=403,
            details={"email": email},
        )
    if existing is not None:
        raise _refused(
            sso,
            "other_organization",
            f"{email} cannot sign in to {sso.organization.name} here.",
            status=403,
            details={"email": email},
        )
    user = _member_create(sso, email, claims, role)
    return user, user.membership


def subject_key(sso: SingleSignOn, subject) -> str:
    """The member's identity at the provider: its issuer and `sub` (OpenID Connect's
    stable identifier; an email address can pass to someone else)."""
    return f"{sso.issuer} {subject}"[:255]


def _check_subject(sso: SingleSignOn, membership: Membership, claims: dict) -> None:
    """Once a member signed in through this issuer, only the same `sub` is them: a
    provider that gives their email address to another account does not give that
    account their Quor access. Another issuer (the organization changed provider) binds
    anew."""
    known = membership.sso_subject
    if known.startswith(f"{sso.issuer} ") and known != subject_key(sso, claims["sub"]):
        raise _refused(
            sso,
            "subject_changed",
            "Your identity provider names another account for this email address than "
            "before. Ask your administrator.",
            status=403,
            details={"email": membership.user.email},
        )


def _role_from(sso: SingleSignOn, claims: dict) -> str | None:
    value = _claim(claims, sso.role_claim)
    if isinstance(value, list):
        value = next((item for item in value if item in ROLES_FROM_CLAIM), None)
    return value if value in ROLES_FROM_CLAIM else None


def _groups_from(sso: SingleSignOn, claims: dict) -> list[str] | None:
    """The group names the claim lists; None when groups are not synchronised or the
    token does not carry the claim (then a member's groups are left as they are)."""
    if not sso.groups_claim or sso.groups_claim not in claims:
        return None
    value = claims[sso.groups_claim]
    names = value if isinstance(value, list) else [value]
    return sorted({name.strip()[:120] for name in names if isinstance(name, str) and name.strip()})


def _member_create(sso: SingleSignOn, email: str, claims: dict, role: str | None) -> User:
    user = User.objects.create_user(email=email, password=None)
    user.full_name = str(_claim(claims, sso.name_claim) or "")[:200]
    user.save(update_fields=["full_name"])
    membership = Membership.objects.create(
        user=user,
        organization=sso.organization,
        role=role or Role.MEMBER,
        sso_subject=subject_key(sso, claims["sub"]),
    )
    audit_record(
        "sso.user_created",
        target=membership,
        organization=sso.organization,
        actor=user,
        changes={"email": email, "role": membership.role, "issuer": sso.issuer},
    )
    return user


def _apply_claims(sso, user, membership, claims, role, group_names) -> dict:
    changes = {}
    subject = subject_key(sso, claims["sub"])
    if membership.sso_subject != subject:
        membership.sso_subject = subject
        membership.save(update_fields=["sso_subject"])
    name = _claim(claims, sso.name_claim)
    if isinstance(name, str) and name.strip() and name.strip()[:200] != user.full_name:
        changes["full_name"] = [user.full_name, name.strip()[:200]]
        user.full_name = name.strip()[:200]
        user.save(update_fields=["full_name"])
    if role and role != membership.role and membership.role != Role.OWNER:
        changes["role"] = [membership.role, role]
        membership.role = role
        membership.save(update_fields=["role"])
    if group_names is not None:
        changes.update(_groups_set(sso.organization, user, group_names))
    return changes


def _groups_set(organization: Organization, user: User, names: list[str]) -> dict:
    """Puts the member in exactly the organization's groups named (creating missing
    ones); groups outside the organization are not touched."""
    wanted = []
    for name in names:
        organization_group = _organization_group_named(organization, name)
        if organization_group is not None:
            wanted.append(organization_group.group)
    current = set(user.groups.filter(organization_group__organization=organization))
    added, removed = set(wanted) - current, current - set(wanted)
    user.groups.add(*added)
    user.groups.remove(*removed)
    if not added and not removed:
        return {}
    return {
        "groups_added": sorted(group.organization_group.display_name for group in added),
        "groups_removed": sorted(group.organization_group.display_name for group in removed),
    }


def _organization_group_named(organization: Organization, name: str):
    existing = OrganizationGroup.objects.filter(organization=organization, display_name=name)
    if (found := existing.select_related("group").first()) is not None:
        return found
    try:
        with transaction.atomic():
            group = DjangoGroup.objects.create(name=f"{organization.slug}: {name}"[:150])
    except IntegrityError:
        logger.warning("sso: group %r not created: a Django group has its name", name)
        return None
    organization_group = OrganizationGroup.objects.create(
        organization=organization, group=group, display_name=name
    )
    audit_record(
        "group.added",
        target=organization_group,
        organization=organization,
        changes={"display_name": name, "via": "sso"},
    )
    return organization_group


def _refused(sso, reason: str, message: str, *, status: int = 400, details=None):
    """The refusal to raise; `sign_in_complete` records it once any transaction of the
    sign-in has rolled back."""
    if sso is not None:
        details = {"organization": sso.organization, "issuer": sso.issuer, **(details or {})}
    return SignInRefused(reason, message, status=status, details=details)


def sign_out_url(request, post_logout_redirect_uri: str) -> str | None:
    """Where to send a member who signed in with SSO as they log out: their provider's
    end_session_endpoint (RP-initiated logout), so the provider's session ends too.
    None when they did not sign in that way or the provider has no such endpoint."""
    signed_in = request.session.get(SIGNED_IN_KEY)
    if not signed_in:
        return None
    sso = SingleSignOn.objects.filter(organization_id=signed_in["organization"]).first()
    if sso is None:
        return None
    client = _client_for(sso)
    try:
        metadata = _provider_metadata(client, sso)
    except SignInRefused:
        return None
    if not metadata.get("end_session_endpoint"):
        return None
    return client.create_logout_url(
        post_logout_redirect_uri=post_logout_redirect_uri,
        id_token_hint=signed_in["id_token"],
        client_id=sso.client_id,
    )["url"]


def password_login_refused(user: User) -> bool:
    """A member whose organization signs in with SSO only; owners keep their password,
    so that a broken identity provider never locks the organization out."""
    membership = getattr(user, "membership", None)
    if membership is None or membership.role == Role.OWNER:
        return False
    sso = SingleSignOn.objects.filter(organization_id=membership.organization_id).first()
    return sso is not None and sso.enabled and not sso.password_login


BACK_CHANNEL_LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
LOGOUT_TOKEN_MAX_AGE_SECONDS = 600


class LogoutTokenRefused(Exception):
    pass


def back_channel_logout(logout_token: str) -> int:
    """Ends the Quor sessions that a provider says ended there (OpenID Connect
    Back-Channel Logout 1.0): the member's sign-ins through that provider, or only the
    one of the provider's session `sid` when the token names it. The token is checked as
    an ID token is (signature against the provider's keys, issuer, audience, times),
    must carry the logout event and no nonce, and is used once (its `jti`). Returns the
    number of sessions ended."""
    unverified = _unverified_claims(logout_token)
    sso = _single_sign_on_of(unverified)
    claims = _verified_logout_claims(sso, logout_token)
    if not _used_first_time(sso, claims["jti"]):
        raise LogoutTokenRefused("This logout token was already used.")
    membership = (
        Membership.objects.select_related("user")
        .filter(organization=sso.organization, sso_subject=subject_key(sso, claims["sub"]))
        .first()
    )
    if membership is None:
        return 0
    session_id = claims.get("sid")

    def signed_in_here(data) -> bool:
        signed_in = data.get(SIGNED_IN_KEY) or {}
        return signed_in.get("organization") == sso.organization_id and (
            session_id is None or signed_in.get("sid") == session_id
        )

    ended = login_sessions_end(membership.user, where=signed_in_here)
    audit_record(
        "sso.logout",
        target=membership,
        organization=sso.organization,
        changes={"issuer": sso.issuer, "sid": session_id, "sessions_ended": ended},
    )
    return ended


def _unverified_claims(logout_token: str) -> dict:
    """The claims before any check, only to find whose provider sent it."""
    try:
        claims = json.loads(extract_compact(logout_token.encode()).payload)
    except (JoseError, ValueError):
        raise LogoutTokenRefused("The logout token is not a signed JWT.") from None
    if not isinstance(claims, dict):
        raise LogoutTokenRefused("The logout token is not a signed JWT.")
    return claims


def _single_sign_on_of(claims: dict) -> SingleSignOn:
    audiences = claims.get("aud")
    audiences = audiences if isinstance(audiences, list) else [audiences]
    for sso in SingleSignOn.objects.select_related("organization").filter(
        issuer=str(claims.get("iss")), enabled=True
    ):
        if sso.client_id in audiences:
            return sso
    raise LogoutTokenRefused("No organization signs in with this issuer and audience.")


def _verified_logout_claims(sso: SingleSignOn, logout_token: str) -> dict:
    client = _client_for(sso)
    try:
        metadata = _provider_metadata(client, sso)
    except SignInRefused as refusal:
        raise LogoutTokenRefused(refusal.message) from None
    registry = JWSRegistry(algorithms=metadata["id_token_signing_alg_values_supported"])
    try:
        try:
            token = jwt.decode(
                logout_token, KeySet.import_key_set(client.fetch_jwk_set()), registry=registry
            )
        except InvalidKeyIdError:
            keys = KeySet.import_key_set(client.fetch_jwk_set(force=True))
            token = jwt.decode(logout_token, keys, registry=registry)
        JWTClaimsRegistry(
            leeway=120,
            iss={"essential": True, "value": sso.issuer},
            aud={"essential": True, "value": sso.client_id},
            iat={"essential": True},
            jti={"essential": True},
            sub={"essential": True},
        ).validate(token.claims)
    except JoseError as exc:
        raise LogoutTokenRefused(f"The logout token is not valid ({exc.error}).") from None
    claims = token.claims
    if time.time() - claims["iat"] > LOGOUT_TOKEN_MAX_AGE_SECONDS:
        raise LogoutTokenRefused("The logout token is too old.")
    events = claims.get("events")
    if not isinstance(events, dict) or BACK_CHANNEL_LOGOUT_EVENT not in events:
        raise LogoutTokenRefused("The token carries no back-channel logout event.")
    if "nonce" in claims:
        raise LogoutTokenRefused("A logout token carries no nonce.")
    return claims


def _used_first_time(sso: SingleSignOn, jti) -> bool:
    """Remembers a logout token's jti for as long as its iat is accepted. Without Redis
    the token is taken: repeating a logout ends nothing more."""
    key = f"quor:sso:logout:{sso.organization_id}:{hashlib.sha256(str(jti).encode()).hexdigest()}"
    try:
        return bool(redis_client().set(key, "1", nx=True, ex=LOGOUT_TOKEN_MAX_AGE_SECONDS + 120))
    except redis.RedisError as exc:
        logger.warning("sso: a logout token's jti was not checked: %s", exc)
        return True
