from django.contrib import admin

from approvals.models import ApprovalRequest
from quor.admin import OrganizationAdminAccess


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    """A read-only record of what was asked and who decided."""

    organization_field = "session__owner__membership__organization"
    list_display = ["created_at", "app_name", "method", "url", "status", "decided_via"]
    list_filter = ["status", "decided_via"]
    search_fields = ["app_name", "url", "summary"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
