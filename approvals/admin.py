from django.contrib import admin
from django.utils.text import Truncator

from approvals.models import ApprovalRequest
from apps.models import Policy
from quor.admin import OrganizationAdminAccess, ReadOnlyAdmin
from quor.lib.permissions import Permission

POLICY_LABELS = {value: label.lower() for value, label in Policy.choices}


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin, OrganizationAdminAccess, admin.ModelAdmin):
    """A read-only record of what was asked, in whose session, and who decided."""

    organization_field = "session__owner__membership__organization"
    admin_permissions = {
        "view": Permission.ORGANIZATION_VIEW,
        "add": None,
        "change": None,
        "delete": None,
    }
    list_display = [
        "created_at",
        "session_owner",
        "app_name",
        "short_summary",
        "status",
        "decided_via",
    ]
    list_filter = ["status", "decided_via"]
    search_fields = ["app_name", "url", "summary", "session__owner__email"]
    list_select_related = ["session__owner"]
    # Users and sessions are shown as text: their admin pages are for superusers only.
    fields = [
        "created_at",
        "session_owner",
        "session_name",
        "app_name",
        "method",
        "url",
        "summary",
        "matched_actions",
        "status",
        "decided_via",
        "decider",
        "decided_at",
        "expires_at",
    ]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("session__owner", "decided_by")

    @admin.display(description="Session owner", ordering="session__owner__email")
    def session_owner(self, obj):
        return obj.session.owner.email

    @admin.display(description="Session")
    def session_name(self, obj):
        session = obj.session
        return f"{session.title} ({session.pk})" if session.title else str(session.pk)

    @admin.display(description="Summary", ordering="summary")
    def short_summary(self, obj):
        return Truncator(obj.summary).chars(80)

    @admin.display(description="Actions")
    def matched_actions(self, obj):
        """`Create an issue (ask), Merge a pull request (auto-approve)`: strictest first."""
        actions = obj.actions if isinstance(obj.actions, list) else []
        parts = []
        for action in actions:
            if not isinstance(action, dict):
                continue
            name = action.get("name") or action.get("key") or "?"
            policy = action.get("policy", "")
            parts.append(f"{name} ({POLICY_LABELS.get(policy, policy)})" if policy else name)
        return ", ".join(parts) or "—"

    @admin.display(description="Decided by")
    def decider(self, obj):
        return obj.decided_by.email if obj.decided_by else "—"
