from django.contrib import admin

from quor.admin import OrganizationAdminAccess
from sandboxes.models import AgentEvent, LibraryFile, Sandbox, Session, Skill


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    list_display = [
        "user",
        "state",
        "backend",
        "network_policy",
        "image_ref",
        "last_activity_at",
        "updated_at",
    ]
    list_filter = ["state", "backend", "network_policy"]
    search_fields = ["user__email", "runtime_id", "id"]
    list_select_related = ["user"]
    readonly_fields = [
        "id",
        "runtime_id",
        "image_ref",
        "created_at",
        "updated_at",
        "last_activity_at",
    ]


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "model_name", "status", "created_at", "finished_at"]
    list_filter = ["status", "model_provider__kind", "created_at"]
    search_fields = ["title", "owner__email", "id"]
    list_select_related = ["owner"]
    readonly_fields = ["id", "created_at", "updated_at"]
    raw_id_fields = ["sandbox"]


@admin.register(AgentEvent)
class AgentEventAdmin(admin.ModelAdmin):
    list_display = ["session", "seq", "kind", "created_at"]
    list_filter = ["kind", "created_at"]
    search_fields = ["session__id", "session__owner__email"]
    list_select_related = ["session"]
    readonly_fields = ["session", "seq", "kind", "payload", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Skill)
class SkillAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    """Skill bundles can contain executable scripts: review them as code before adding."""

    list_display = ["name", "organization", "description", "updated_at"]
    list_filter = ["organization"]
    search_fields = ["name", "description"]


@admin.register(LibraryFile)
class LibraryFileAdmin(admin.ModelAdmin):
    list_display = ["path", "owner", "size", "updated_at"]
    search_fields = ["path", "owner__email"]
    list_select_related = ["owner"]
    fields = ["owner", "path", "sha256", "updated_at"]
    readonly_fields = ["sha256", "updated_at"]

    @admin.display(description="Size")
    def size(self, obj):
        return len(obj.content)
