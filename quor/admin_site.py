"""The admin site, entered by superusers and by the roles that may read their
organization's configuration (quor/lib/permissions.py), not by Django's staff flag:
a role change takes effect here at the next request."""

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from quor.lib.permissions import Permission, has_permission


def may_enter_admin_site(user) -> bool:
    """Superusers; Quor's own staff, who belong to no organization and get Django's model
    permissions; and members whose role may read their organization's configuration."""
    if not (user.is_active and user.is_authenticated):
        return False
    if user.is_superuser:
        return True
    if getattr(user, "membership", None) is None:
        return user.is_staff
    return has_permission(user, Permission.ORGANIZATION_VIEW)


class AdminSiteAuthenticationForm(AdminAuthenticationForm):
    def confirm_login_allowed(self, user):
        AuthenticationForm.confirm_login_allowed(self, user)
        if not may_enter_admin_site(user):
            raise self.get_invalid_login_error()


class QuorAdminSite(admin.AdminSite):
    site_header = "Quor administration"
    site_title = "Quor admin"
    login_form = AdminSiteAuthenticationForm

    def has_permission(self, request):
        return may_enter_admin_site(request.user)
