"""Writes to organizations, members, model providers and API tokens.

Every function takes keyword arguments, validates, and raises a QuorError that
the API, admin and management commands all report the same way.
"""

import hashlib
import secrets

from django.contrib.auth.password_validation import validate_password
from django.contrib.sessions.models import Session as LoginSession
from django.core.exceptions import ValidationError
from django.core.validators import validate_email, validate_slug
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from quor.audit import audit_record, field_changes, organization_of, secret_change
from quor.lib.errors import Conflict, InvalidInput, NotFound
from quor.lib.permissions import check_may_manage_member, check_role_change
from quor.lib.tasks import send_on_commit
from quor.models import ApiToken, Membership, ModelProvider, Organization, User
from quor.signals import user_deactivated

API_TOKEN_PREFIX = "quor_pat_"  # noqa: S105  (a visible prefix, not a secret)


def organization_create(*, slug: str, name: str) -> Organization:
    try:
        validate_slug(slug)
    except ValidationError:
        raise InvalidInput(
            f"{slug!r} is not a valid slug (letters, digits, - and _).",
            code="organizations.invalid_slug",
        ) from None
    if not name.strip():
        raise InvalidInput("An organization needs a name.", code="organizations.invalid_name")
    if Organization.objects.filter(slug=slug).exists():
        raise Conflict(f"An organization {slug!r} already exists.", code="organizations.exists")
    with transaction.atomic():
        organization = Organization.objects.create(slug=slug, name=name.strip())
        audit_record("organization.added", target=organization, changes={"name": name.strip()})
    return organization


ORGANIZATION_SETTINGS = ("name", "is_active", "sandbox_enabled")


@transaction.atomic
def organization_update(*, organization: Organization, **changes) -> Organization:
    """Changes the name, whether the organization is enabled and whether it may use
    Sandbox; anything else is refused before anything is written."""
    unknown = set(changes) - set(ORGANIZATION_SETTINGS)
    if unknown:
        raise InvalidInput(
            f"Unknown organization settings: {', '.join(sorted(unknown))}.",
            code="organizations.invalid_setting",
        )
    if "name" in changes and not str(changes["name"]).strip():
        raise InvalidInput("An organization needs a name.", code="organizations.invalid_name")
    locked = Organization.objects.select_for_update().get(pk=organization.pk)
    before = {field: getattr(locked, field) for field in changes}
    for field, value in changes.items():
        setattr(locked, field, value.strip() if field == "name" else value)
    locked.save(update_fields=list(changes))
    recorded = field_changes(before, {field: getattr(locked, field) for field in changes})
    if recorded:
        audit_record("organization.changed", target=locked, changes=recorded)
    return locked


@transaction.atomic
def member_update(
    *, membership: Membership, actor=None, via: str = "admin", **changes
) -> Membership:
    """Changes a member's role, Sandbox right or whether they are active, as `actor` may
    (check_role_change; None: the operator or a command, bound only by the last-owner
    rule)."""
    unknown = set(changes) - {"role", "can_use_sandbox", "is_active"}
    if unknown:
        raise InvalidInput(
            f"Unknown member settings: {', '.join(sorted(unknown))}.",
            code="members.invalid_setting",
        )
    if "is_active" in changes:
        is_active = changes.pop("is_active")
        if not isinstance(is_active, bool):
            raise InvalidInput("is_active is true or false.", code="members.invalid_setting")
        check_may_manage_member(actor, membership)
        if is_active:
            user_reactivate(user=membership.user, actor=actor, via=via)
        else:
            user_deactivate(user=membership.user, actor=actor, via=via)
    locked = Membership.objects.select_for_update().get(pk=membership.pk)
    if "role" in changes and changes["role"] != locked.role:
        check_role_change(actor, locked, changes["role"])
    before = {field: getattr(locked, field) for field in changes}
    for field, value in changes.items():
        setattr(locked, field, value)
    locked.save(update_fields=list(changes))
    recorded = field_changes(before, {field: getattr(locked, field) for field in changes})
    if recorded:
        audit_record("member.changed", target=locked, changes=recorded, actor=actor)
    return locked


@transaction.atomic
def user_deactivate(*, user: User, actor=None, via: str) -> User:
    """Takes a person's access away everywhere, whoever asks (the admin, the operator
    API, SCIM, SSO). In this transaction: the user is inactive, their login sessions
    and API tokens end, and the packages above (quor/signals.py) fail their parked
    approvals and queue the rest: running turns cancelled, open event streams closed,
    the sandbox put to sleep (its snapshot kept). Run again for an inactive user, it
    finishes what a crash left half done."""
    locked = User.objects.select_for_update(no_key=True).get(pk=user.pk)
    was_active = locked.is_active
    if was_active:
        locked.is_active = False
        locked.save(update_fields=["is_active"])
    ended = login_sessions_end(locked)
    revoked = ApiToken.objects.filter(user=locked, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    if was_active or ended or revoked:
        audit_record(
            "user.deactivated",
            target=locked,
            organization=organization_of(locked),
            actor=actor,
            changes={
                "is_active": [was_active, False],
                "via": via,
                "login_sessions_ended": ended,
                "api_tokens_revoked": revoked,
            },
        )
    user_deactivated.send(User, user=locked)
    return locked


@transaction.atomic
def user_reactivate(*, user: User, actor=None, via: str) -> User:
    """Lets the person in again. What deactivation ended stays ended: they log in anew
    and create new API tokens; the sandbox wakes from its snapshot when used."""
    updated = User.objects.filter(pk=user.pk, is_active=False).update(is_active=True)
    user.refresh_from_db()
    if updated:
        audit_record(
            "user.reactivated",
            target=user,
            organization=organization_of(user),
            actor=actor,
            changes={"is_active": [False, True], "via": via},
        )
    return user


@transaction.atomic
def user_delete(*, user: User, actor=None, via: str) -> None:
    """Deactivates first (what waits on the user fails, their streams close), then
    deletes the user with their sessions and sandbox row; the reconciliation that
    follows removes the runtime and workspace no row claims any more."""
    user_deactivate(user=user, actor=actor, via=via)
    audit_record(
        "user.deleted",
        target=user,
        organization=organization_of(user),
        actor=actor,
        changes={"email": user.email, "via": via},
    )
    user.sessions.all().delete()  # before the sandbox they point to (PROTECT)
    User.objects.filter(pk=user.pk).delete()
    send_on_commit("sandboxes.tasks.reconcile_sandboxes")


def login_sessions_end(user: User, where=None) -> int:
    """Deletes the user's browser login sessions (those whose data `where` accepts, if
    given). Django keeps no index of sessions by user, so every unexpired one is
    decoded; a deactivation or a back-channel logout is rare."""
    mine = [
        session.pk
        for session in LoginSession.objects.filter(expire_date__gt=timezone.now()).iterator()
        if (data := session.get_decoded()).get("_auth_user_id") == str(user.pk)
        and (where is None or where(data))
    ]
    deleted, _ = LoginSession.objects.filter(pk__in=mine).delete()
    return deleted


def generate_password() -> str:
    return secrets.token_urlsafe(15)


@transaction.atomic
def member_create(
    *,
    email: str,
    organization: Organization,
    role: str = Membership.Role.MEMBER,
    can_use_sandbox: bool = True,
    password: str | None = None,
) -> User:
    """A new user in the organization, with a role (quor/lib/permissions.py)."""
    email = email.strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise InvalidInput(
            f"{email!r} is not a valid email address.", code="members.invalid_email"
        ) from None
    if role not in Membership.Role.values:
        raise InvalidInput(f"Unknown role {role!r}.", code="members.invalid_role")
    if User.objects.filter(email=email).exists():
        raise Conflict(f"A user {email} already exists.", code="members.exists")
    if password is not None:
        try:
            validate_password(password)
        except ValidationError as exc:
            raise InvalidInput(" ".join(exc.messages), code="members.weak_password") from None
    user = User.objects.create_user(email=email, password=password)
    membership = Membership.objects.create(
        user=user, organization=organization, role=role, can_use_sandbox=can_use_sandbox
    )
    audit_record(
        "member.added",
        target=membership,
        organization=organization,
        changes={"role": role, "can_use_sandbox": can_use_sandbox},
    )
    return user


def _hash_token(raw_token: str) -> str:
    return hashlib.sha256(raw_token.encode()).hexdigest()


def api_token_create(*, user: User, name: str) -> tuple[ApiToken, str]:
    """A new personal API token; the raw value is returned once and never stored."""
    name = name.strip()
    if not name or len(name) > 100:  # ApiToken.name's max_length
        raise InvalidInput(
            "A token needs a name of 1 to 100 characters.", code="tokens.invalid_name"
        )
    raw_token = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=raw_token[: len(API_TOKEN_PREFIX) + 6],
        token_hash=_hash_token(raw_token),
    )
    audit_record(
        "api_token.created",
        target=token,
        changes={"owner": user.email},
        organization=organization_of(user),
    )
    return token, raw_token


def api_token_revoke(*, user: User, token_id: int) -> ApiToken:
    token = ApiToken.objects.filter(user=user, pk=token_id).first()
    if token is None:
        raise NotFound("No such token.")
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    token.refresh_from_db()
    if revoked:
        audit_record(
            "api_token.revoked",
            target=token,
            changes={"owner": user.email},
            organization=organization_of(user),
        )
    return token


def api_token_authenticate(*, raw_token: str) -> User | None:
    """The active user owning this unrevoked token, or None.

    The lookup is by SHA-256 of a 256-bit random token, so timing reveals nothing useful.
    """
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=_hash_token(raw_token), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def _clean_model_names(model_names) -> list[str]:
    if not isinstance(model_names, list) or not all(
        isinstance(name, str) and name.strip() for name in model_names
    ):
        raise InvalidInput(
            "model_names must be a list of non-empty strings.",
            code="model_providers.invalid_models",
        )
    return list(dict.fromkeys(name.strip() for name in model_names))


@transaction.atomic
def model_provider_create(
    *,
    organization: Organization,
    kind: str,
    display_name: str,
    api_key: str = "",
    base_url: str = "",
    model_names: list[str] | None = None,
    available_to_everyone: bool = True,
    allowed_users=(),
    allowed_groups=(),
) -> ModelProvider:
    if kind not in ModelProvider.Kind.values:
        raise InvalidInput(f"Unknown provider kind {kind!r}.", code="model_providers.invalid_kind")
    provider = ModelProvider.objects.create(
        organization=organization,
        kind=kind,
        display_name=display_name,
        api_key=api_key,
        base_url=base_url,
        model_names=_clean_model_names(model_names or []),
        available_to_everyone=available_to_everyone,
    )
    _set_provider_audience(provider, organization, allowed_users, allowed_groups)
    audit_record("model_provider.added", target=provider, changes=_provider_fields(provider))
    return provider


def _provider_fields(provider: ModelProvider) -> dict:
    """What the audit log says of a provider: its settings, and whether a key is set."""
    return {
        "kind": provider.kind,
        "display_name": provider.display_name,
        "base_url": provider.base_url,
        "model_names": provider.model_names,
        "available_to_everyone": provider.available_to_everyone,
        "allowed_users": sorted(provider.allowed_users.values_list("email", flat=True)),
        "allowed_groups": sorted(provider.allowed_groups.values_list("name", flat=True)),
        "api_key": "set" if provider.has_api_key else "not set",
    }


@transaction.atomic
def model_provider_update(*, provider: ModelProvider, **changes) -> ModelProvider:
    """Changes the given fields. An empty or missing api_key keeps the stored key."""
    allowed_users = changes.pop("allowed_users", None)
    allowed_groups = changes.pop("allowed_groups", None)
    if not changes.get("api_key"):
        changes.pop("api_key", None)
    if "model_names" in changes:
        changes["model_names"] = _clean_model_names(changes["model_names"])
    before = _provider_fields(provider)
    for field, value in changes.items():
        setattr(provider, field, value)
    provider.save()
    _set_provider_audience(provider, provider.organization, allowed_users, allowed_groups)
    after = _provider_fields(provider)
    if "api_key" in changes:
        after["api_key"] = secret_change(before["api_key"] == "set", True)
    recorded = field_changes(before, after)
    if recorded:
        audit_record("model_provider.changed", target=provider, changes=recorded)
    return provider


def _set_provider_audience(provider, organization, allowed_users, allowed_groups):
    if allowed_users is not None:
        user_ids = {user.pk for user in allowed_users}
        members = Membership.objects.filter(user_id__in=user_ids, organization=organization)
        if members.count() != len(user_ids):
            raise InvalidInput(
                "allowed_users may only name members of the organization.",
                code="model_providers.invalid_audience",
            )
        provider.allowed_users.set(allowed_users)
    if allowed_groups is not None:
        provider.allowed_groups.set(allowed_groups)


def model_provider_delete(*, provider: ModelProvider) -> None:
    try:
        with transaction.atomic():
            audit_record("model_provider.deleted", target=provider)
            provider.delete()
    except ProtectedError:
        raise Conflict(
            "Sessions use this provider; remove its models or keep it.",
            code="model_providers.in_use",
        ) from None
