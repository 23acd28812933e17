"""Service accounts: organizations' integrations, with tokens limited to scopes (the
API views declare which scope each action needs) and to a lifetime."""

import hashlib
import secrets
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from quor.audit import audit_record
from quor.lib.errors import AccessDenied, Conflict, InvalidInput, NotFound
from quor.lib.ids import is_database_id
from quor.lib.permissions import Permission, has_permission
from quor.models import Membership, Organization, ServiceAccount, ServiceAccountToken, User

TOKEN_PREFIX = "quor_sat_"  # noqa: S105  (a visible prefix, not a secret)
MAX_LIFETIME_DAYS = 365
EMAIL_DOMAIN = "service-accounts.quor.invalid"  # .invalid: never a real mailbox (RFC 2606)


def _hash(raw_token: str) -> str:
    return hashlib.sha256(raw_token.encode()).hexdigest()


def clean_scopes(scopes) -> list[str]:
    if not isinstance(scopes, list) or not scopes:
        raise InvalidInput(
            "scopes must be a non-empty list.", code="service_accounts.invalid_scopes"
        )
    unknown = [s for s in scopes if s not in ServiceAccount.Scope.values]
    if unknown:
        raise InvalidInput(
            f"Unknown scopes: {', '.join(map(str, unknown))}; known: "
            f"{', '.join(ServiceAccount.Scope.values)}.",
            code="service_accounts.invalid_scopes",
        )
    return sorted(set(scopes))


def check_may_give_scopes(actor, scopes) -> None:
    """The scim scope provisions and deprovisions everyone, owners included: only those
    who manage owners and admins give it, or make its tokens (None: the operator or a
    command)."""
    if actor is None or actor.is_superuser or ServiceAccount.Scope.SCIM not in scopes:
        return
    if not has_permission(actor, Permission.ADMINS_MANAGE):
        raise AccessDenied(
            "Only an owner gives the scim scope or makes its tokens.",
            code="access.owner_required",
        )


@transaction.atomic
def service_account_create(
    *, organization: Organization, name: str, scopes, actor=None
) -> ServiceAccount:
    """The account and the member it acts as (no password: it signs in with tokens only)."""
    name = (name or "").strip()
    if not name or len(name) > 100 or not slugify(name):
        raise InvalidInput(
            "A service account needs a name of 1 to 100 characters.",
            code="service_accounts.invalid_name",
        )
    scopes = clean_scopes(scopes)
    check_may_give_scopes(actor, scopes)
    if ServiceAccount.objects.filter(organization=organization, name=name).exists():
        raise Conflict(f"A service account {name!r} exists.", code="service_accounts.exists")
    email = f"{slugify(name)}.{secrets.token_hex(4)}.{organization.slug}@{EMAIL_DOMAIN}"
    user = User.objects.create_user(email=email, password=None, full_name=name)
    Membership.objects.create(user=user, organization=organization, role=Membership.Role.MEMBER)
    try:
        with transaction.atomic():
            account = ServiceAccount.objects.create(
                organization=organization, user=user, name=name, scopes=scopes
            )
    except IntegrityError:
        raise Conflict(
            f"A service account {name!r} exists.", code="service_accounts.exists"
        ) from None
    audit_record("service_account.added", target=account, changes={"scopes": scopes})
    return account


def get_service_account(organization: Organization, account_id) -> ServiceAccount:
    account = (
        ServiceAccount.objects.filter(organization=organization, pk=account_id).first()
        if is_database_id(account_id)
        else None
    )
    if account is None:
        raise NotFound("No such service account.", code="service_accounts.not_found")
    return account


@transaction.atomic
def service_account_update(*, account: ServiceAccount, scopes, actor=None) -> ServiceAccount:
    scopes = clean_scopes(scopes)
    check_may_give_scopes(actor, set(scopes) ^ set(account.scopes))
    if scopes != account.scopes:
        audit_record(
            "service_account.changed", target=account, changes={"scopes": [account.scopes, scopes]}
        )
        account.scopes = scopes
        account.save(update_fields=["scopes"])
    return account


@transaction.atomic
def service_account_disable(*, account: ServiceAccount) -> ServiceAccount:
    """Its tokens stop working at once; its sessions and files stay for the record."""
    if account.disabled_at is None:
        now = timezone.now()
        account.disabled_at = now
        account.save(update_fields=["disabled_at"])
        account.tokens.filter(revoked_at__isnull=True).update(revoked_at=now)
        User.objects.filter(pk=account.user_id).update(is_active=False)
        audit_record("service_account.disabled", target=account)
    return account


@transaction.atomic
def service_account_token_create(
    *, account: ServiceAccount, lifetime_days: int = 90, actor=None
) -> tuple[ServiceAccountToken, str]:
    """A new token, shown once; the others keep working until they expire or are revoked."""
    check_may_give_scopes(actor, account.scopes)
    if account.disabled_at is not None:
        raise Conflict("The service account is disabled.", code="service_accounts.disabled")
    if not isinstance(lifetime_days, int) or not 1 <= lifetime_days <= MAX_LIFETIME_DAYS:
        raise InvalidInput(
            f"lifetime_days must be 1 to {MAX_LIFETIME_DAYS}.",
            code="service_accounts.invalid_lifetime",
        )
    raw_token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ServiceAccountToken.objects.create(
        service_account=account,
        prefix=raw_token[: len(TOKEN_PREFIX) + 6],
        token_hash=_hash(raw_token),
        expires_at=timezone.now() + timedelta(days=lifetime_days),
    )
    audit_record(
        "service_account.token_created",
        target=account,
        changes={"token": token.prefix, "expires_at": token.expires_at.isoformat()},
    )
    return token, raw_token


@transaction.atomic
def service_account_token_revoke(*, account: ServiceAccount, token_id) -> ServiceAccountToken:
    token = account.tokens.filter(pk=token_id).first() if is_database_id(token_id) else None
    if token is None:
        raise NotFound("No such token.", code="service_accounts.token_not_found")
    revoked = ServiceAccountToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    if revoked:
        audit_record(
            "service_account.token_revoked", target=account, changes={"token": token.prefix}
        )
    token.refresh_from_db()
    return token


def service_account_authenticate(raw_token: str) -> ServiceAccountToken | None:
    """The live token (unrevoked, unexpired, of an enabled account of an enabled
    organization), or None."""
    now = timezone.now()
    token = (
        ServiceAccountToken.objects.select_related(
            "service_account__user", "service_account__organization"
        )
        .filter(
            token_hash=_hash(raw_token),
            revoked_at__isnull=True,
            expires_at__gt=now,
            service_account__disabled_at__isnull=True,
            service_account__user__is_active=True,
            service_account__organization__is_active=True,
        )
        .first()
    )
    if token is None:
        return None
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ServiceAccountToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
