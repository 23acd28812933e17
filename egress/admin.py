from django.contrib import admin

from egress.models import EgressDecision, EgressDomainRule


@admin.register(EgressDomainRule)
class EgressDomainRuleAdmin(admin.ModelAdmin):
    list_display = ["pattern", "action", "organization", "note", "created_at"]
    list_filter = ["action", "organization"]
    search_fields = ["pattern", "note", "organization__name"]


@admin.register(EgressDecision)
class EgressDecisionAdmin(admin.ModelAdmin):
    """Read-only audit trail."""

    list_display = [
        "created_at",
        "outcome",
        "code",
        "method",
        "host",
        "port",
        "sandbox_id",
        "credential_kind",
    ]
    list_filter = ["outcome", "code", "credential_kind", "created_at"]
    search_fields = ["host", "path", "=sandbox_id", "=session_id"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
