"""Roles, permissions and the access checks, in one place, used by every entry point
(API, admin, pages, WebSockets, the web app proxy, tasks, commands).

Each view names the one permission it needs (`page_requires`, `required_permission` on
API views and consumers, the admin's view and manage permissions); `ROLE_PERMISSIONS`
says which roles hold it. tests/quor/test_permission_table.py walks every URL and
WebSocket route with every role and fails on any answer the table does not predict.
"""

import enum
import functools

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission

from quor.lib import logs
from quor.lib.errors import AccessDenied, InvalidInput
from quor.models import Membership, ServiceAccountToken


class Permission(enum.StrEnum):
    ACCOUNT = "account"
    """One's own profile and personal API tokens, and the home page."""
    SANDBOX_USE = "sandbox.use"
    """One's own sessions, sandbox, exec, files, scheduled tasks and App credentials."""
    KNOWLEDGE_SEARCH = "knowledge.search"
    """Search the company knowledge one may read."""
    WEBAPP_VIEW = "webapps.view"
    """Open web apps shared with the organization."""
    ORGANIZATION_VIEW = "organization.view"
    """Read the organization's configuration: members, model providers (never their
    keys), Apps and policies, skills, knowledge sources, approvals; the admin site."""
    ORGANIZATION_MANAGE = "organization.manage"
    """Change that configuration, and the roles of members and auditors."""
    AUDIT_VIEW = "audit.view"
    """Read and export the organization's audit log."""
    ADMINS_MANAGE = "organization.admins"
    """Give and take the owner and admin roles."""


Role = Membership.Role

ROLE_PERMISSIONS: dict[str, frozenset[Permission]] = {
    Role.OWNER: frozenset(Permission),
    Role.ADMIN: frozenset(Permission) - {Permission.ADMINS_MANAGE},
    Role.MEMBER: frozenset(
        {
            Permission.ACCOUNT,
            Permission.SANDBOX_USE,
            Permission.KNOWLEDGE_SEARCH,
            Permission.WEBAPP_VIEW,
        }
    ),
    Role.AUDITOR: frozenset(
        {Permission.ACCOUNT, Permission.ORGANIZATION_VIEW, Permission.AUDIT_VIEW}
    ),
}

PUBLIC = "public"
"""Declared by views anyone may call, signed in or not (health checks, the login page)."""

SANDBOX_CREDENTIAL = "sandbox-credential"
"""Declared by the runtime's endpoints: only a sandbox's own credential is accepted."""

OPERATOR = "operator"
"""Declared by the operator API: only the operator token is accepted."""

SCIM_CLIENT = "scim-client"
"""Declared by the SCIM endpoints: only a service account's token with the scim scope is
accepted, and it acts on that account's organization."""


def role_has(role: str, permission: Permission) -> bool:
    return permission in ROLE_PERMISSIONS.get(role, frozenset())


def get_active_membership(user) -> Membership:
    """The user's membership in an enabled organization, or a 403 that says why not."""
    membership = Membership.objects.select_related("organization").filter(user=user).first()
    if membership is None:
        raise AccessDenied(
            "Your account does not belong to an organization.", code="access.no_organization"
        )
    if not membership.organization.is_active:
        raise AccessDenied("Your organization is disabled.", code="access.organization_disabled")
    return membership


def require_permission(user, permission: Permission) -> Membership:
    """The user's active membership if their role holds the permission, else a 403."""
    membership = get_active_membership(user)
    if not role_has(membership.role, permission):
        raise AccessDenied(
            f"Your role ({membership.get_role_display()}) does not allow this "
            f"({permission.value}).",
            code="access.permission_required",
        )
    return membership


def has_permission(user, permission: Permission) -> bool:
    try:
        require_permission(user, permission)
    except AccessDenied:
        return False
    return True


def check_sandbox_access(user) -> Membership:
    """The sandbox permission, and Sandbox switched on for the organization and the member."""
    membership = require_permission(user, Permission.SANDBOX_USE)
    if not membership.organization.sandbox_enabled:
        raise AccessDenied(
            "Sandbox is not enabled for your organization.",
            code="access.sandbox_disabled_for_organization",
        )
    if not membership.can_use_sandbox:
        raise AccessDenied("You are not allowed to use Sandbox.", code="access.sandbox_not_allowed")
    return membership


def check_may_manage_member(actor, membership: Membership, *, new_role: str = "") -> None:
    """The organization's managers manage members and auditors; owners and admins (or
    giving one of those roles) only holders of ADMINS_MANAGE. None: the operator or a
    command."""
    if actor is None or actor.is_superuser:
        return
    acting = require_permission(actor, Permission.ORGANIZATION_MANAGE)
    if acting.organization_id != membership.organization_id:
        raise AccessDenied("Not a member of your organization.", code="access.denied")
    powerful = {Role.OWNER, Role.ADMIN}
    if (new_role in powerful or membership.role in powerful) and not role_has(
        acting.role, Permission.ADMINS_MANAGE
    ):
        raise AccessDenied("Only an owner manages owners and admins.", code="access.owner_required")


def check_role_change(actor, membership: Membership, role: str) -> None:
    """Who may give which role: the organization's managers give and take member and
    auditor; only holders of ADMINS_MANAGE touch an owner's or admin's role, or give
    one. An organization keeps at least one owner."""
    if role not in Role.values:
        raise InvalidInput(f"Unknown role {role!r}.", code="members.invalid_role")
    check_may_manage_member(actor, membership, new_role=role)
    if membership.role == Role.OWNER and role != Role.OWNER:
        others = Membership.objects.filter(
            organization_id=membership.organization_id, role=Role.OWNER
        ).exclude(pk=membership.pk)
        if not others.exists():
            raise InvalidInput(
                "An organization keeps at least one owner: make someone else owner first.",
                code="members.last_owner",
            )


def check_model_access(user, model_id: str):
    """The (provider, model name) the user chose, if they may use it.

    A model that does not exist in the user's organization is unknown (400), so
    other organizations' providers are not revealed; one that exists but is not
    shared with the user is a 403.
    """
    from quor.selectors import find_model, model_provider_is_available_to

    membership = get_active_membership(user)
    choice = find_model(organization=membership.organization, model_id=model_id)
    if choice is None:
        raise InvalidInput(f"Unknown model {model_id!r}.", code="models.unknown_model")
    if not model_provider_is_available_to(choice.provider, user):
        raise AccessDenied(
            f"You are not allowed to use the model {model_id!r}.",
            code="access.model_not_allowed",
        )
    return choice


def page_requires(permission: Permission):
    """A page's declaration: signed in (else the login page) and the permission (else
    the 403 page, which says why)."""

    def decorate(view):
        @functools.wraps(view)
        def checked(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            logs.acting_as(request.user)
            try:
                require_permission(request.user, permission)
            except AccessDenied as exc:
                raise PermissionDenied(exc.message) from None
            return view(request, *args, **kwargs)

        checked.required_permission = permission
        return checked

    return decorate


def public_page(view):
    view.required_permission = PUBLIC
    return view


def declared_permission(view, action: str):
    """The permission an API view declares for an action (a viewset's action, or the
    HTTP method's handler name): `required_permissions` by action, else
    `required_permission` for all. None if it declares nothing."""
    by_action = getattr(view, "required_permissions", None)
    if by_action is not None:
        return by_action.get(action)
    return getattr(view, "required_permission", None)


def declared_scope(view, action: str):
    """The service account scope an API view declares for an action (`required_scopes`
    by action, else `required_scope`); None: service accounts may not call it."""
    by_action = getattr(view, "required_scopes", None)
    if by_action is not None:
        return by_action.get(action)
    return getattr(view, "required_scope", None)


def check_token_scope(token, view, action: str) -> None:
    if not isinstance(token, ServiceAccountToken):
        return
    scope = declared_scope(view, action)
    if scope is None or scope not in token.service_account.scopes:
        raise AccessDenied(
            "This service account's token may not do this"
            + (f" (it needs the '{scope}' scope)." if scope else " (no scope allows it)."),
            code="access.scope_required",
        )


class DeclaredPermission(BasePermission):
    """Every API view's permission class: what the view declares, checked on the
    request's user. A view that declares nothing answers nobody."""

    def has_permission(self, request, view):
        action = getattr(view, "action", None) or request.method.lower()
        permission = declared_permission(view, action)
        if permission == PUBLIC:
            return True
        if not (request.user and request.user.is_authenticated):
            return False
        logs.acting_as(request.user)
        if permission is None:
            return False
        if permission in (SANDBOX_CREDENTIAL, SCIM_CLIENT):
            return True  # the view's only authentication class accepts nothing else
        if permission == OPERATOR or getattr(request.user, "is_operator", False):
            return permission == OPERATOR and getattr(request.user, "is_operator", False)
        check_token_scope(request.auth, view, action)
        require_permission(request.user, permission)
        return True
