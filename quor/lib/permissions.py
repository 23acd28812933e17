"""The access checks, in one place, used by every entry point (API, UI, tasks, commands)."""

from rest_framework.permissions import BasePermission

from quor.lib.errors import AccessDenied, InvalidInput
from quor.models import Membership


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


def check_sandbox_access(user) -> Membership:
    membership = get_active_membership(user)
    if not membership.organization.sandbox_enabled:
        raise AccessDenied(
            "Sandbox is not enabled for your organization.",
            code="access.sandbox_disabled_for_organization",
        )
    if not membership.can_use_sandbox:
        raise AccessDenied("You are not allowed to use Sandbox.", code="access.sandbox_not_allowed")
    return membership


def check_organization_admin(user) -> Membership:
    membership = get_active_membership(user)
    if not membership.is_admin:
        raise AccessDenied(
            "Only organization admins may do this.", code="access.organization_admin_required"
        )
    return membership


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


class IsActiveMember(BasePermission):
    """Default API permission: authenticated, and a member of an enabled organization."""

    def has_permission(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return False
        get_active_membership(request.user)
        return True
