"""The admin site, entered by superusers and by the roles that may read their
organization's configuration (quor/lib/permissions.py), not by Django's staff flag:
a role change takes effect here at the next request."""

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.forms import AuthenticationForm

from quor.lib import logs
from quor.lib.login_attempts import sign_in_rate_limited
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
        logs.acting_as(request.user)
        return may_enter_admin_site(request.user)

    def login(self, request, extra_context=None):
        """The admin's password form is limited like the login page's."""
        return sign_in_rate_limited(super().login)(request, extra_context)

    def register(self, model_or_iterable, admin_class=None, **options):
        """Every model admin records deletions one object at a time, so that each is a
        LogEntry saved on its own, which the audit log hears (quor/receivers.py);
        Django bulk-creates them for a selection, without signals."""
        admin_class = admin_class or admin.ModelAdmin
        audited = type(
            admin_class.__name__,
            (admin_class,),
            {"__module__": admin_class.__module__, "log_deletions": _log_deletions_one_by_one},
        )
        super().register(model_or_iterable, audited, **options)


def _log_deletions_one_by_one(model_admin, request, queryset):
    return [
        LogEntry.objects.log_actions(request.user.pk, [obj], DELETION, single_object=True)
        for obj in queryset
    ]
