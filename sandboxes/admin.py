from django import forms
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from quor.admin import OrganizationAdminAccess, ReadOnlyAdmin
from quor.lib.errors import CorruptBlob, QuorError
from quor.lib.permissions import Permission
from sandboxes.models import (
    AgentEvent,
    Attachment,
    ExecRecord,
    LibraryFile,
    PooledRuntime,
    Sandbox,
    Session,
    Skill,
    TerminalRecording,
    WorkspaceReset,
)
from sandboxes.skills import clean_skill_files, skill_files, skill_set_files


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
        "failure_reason",
    ]
    list_filter = ["state", "backend", "network_policy"]
    search_fields = ["user__email", "runtime_id", "id", "runtime_key"]
    list_select_related = ["user"]
    readonly_fields = [
        "id",
        "runtime_key",
        "runtime_id",
        "image_ref",
        "created_at",
        "updated_at",
        "last_activity_at",
        "has_workspace",
    ]


@admin.register(PooledRuntime)
class PooledRuntimeAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    """The warm pool as it stands: made and removed by the refill task only."""

    list_display = ["key", "backend", "state", "image_ref", "network_address", "created_at"]
    list_filter = ["backend", "state"]
    readonly_fields = [*list_display, "runtime_id", "ready_at"]


@admin.register(WorkspaceReset)
class WorkspaceResetAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    """The record of workspaces given up on purpose: read only."""

    list_display = ["sandbox", "action", "actor", "via", "created_at"]
    list_filter = ["action", "created_at"]
    search_fields = ["sandbox__user__email", "sandbox__id"]
    list_select_related = ["sandbox__user", "actor"]
    readonly_fields = ["sandbox", "action", "actor", "via", "replaced", "created_at"]


class AttachmentInline(admin.TabularInline):
    model = Attachment
    fields = ["name", "size", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    @admin.display(description="Size")
    def size(self, obj):
        return obj.blob.size


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "model_name", "status", "created_at", "finished_at"]
    list_filter = ["status", "model_provider__kind", "created_at"]
    search_fields = ["title", "owner__email", "id"]
    list_select_related = ["owner"]
    readonly_fields = ["id", "created_at", "updated_at"]
    raw_id_fields = ["sandbox"]
    inlines = [AttachmentInline]


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


@admin.register(ExecRecord)
class ExecRecordAdmin(ReadOnlyAdmin, OrganizationAdminAccess, admin.ModelAdmin):
    """The exec journal: who ran what in which session, and what became of it; read by
    those who read the audit log, kept QUOR_EXEC_JOURNAL_RETENTION_DAYS. A terminal
    attachment's commands (via `shell`) are found by its id."""

    admin_permissions = {
        "view": Permission.AUDIT_VIEW,
        "add": None,
        "change": None,
        "delete": None,
    }
    list_display = ["started_at", "user", "session", "via", "__str__", "status", "exit_code"]
    list_filter = ["status", "via", "started_at"]
    search_fields = ["user__email", "session__id", "idempotency_key", "id", "attachment__id"]
    date_hierarchy = "started_at"
    list_select_related = ["user", "session"]
    fields = [
        "id",
        "organization",
        "user",
        "session",
        "via",
        "attachment",
        "idempotency_key",
        "argv",
        "cwd",
        "env_names",
        "timeout_s",
        "status",
        "error",
        "runner",
        "exit_code",
        "timed_out",
        "duration_s",
        "started_at",
        "finished_at",
        "stdout_text",
        "stdout_truncated",
        "stderr_text",
        "stderr_truncated",
    ]
    readonly_fields = fields

    @admin.display(description="stdout")
    def stdout_text(self, record):
        return bytes(record.stdout).decode(errors="replace")

    @admin.display(description="stderr")
    def stderr_text(self, record):
        return bytes(record.stderr).decode(errors="replace")


@admin.register(TerminalRecording)
class TerminalRecordingAdmin(ReadOnlyAdmin, OrganizationAdminAccess, admin.ModelAdmin):
    """Recordings of the sessions' terminals, for those who read the audit log: each one
    downloads as an asciicast v2 file (play it with asciinema); kept
    QUOR_TERMINAL_RECORDING_RETENTION_DAYS."""

    admin_permissions = {
        "view": Permission.AUDIT_VIEW,
        "add": None,
        "change": None,
        "delete": None,
    }
    list_display = ["started_at", "ended_at", "user", "session", "status", "size", "download"]
    list_filter = ["status", "started_at"]
    search_fields = ["user__email", "session__id", "id"]
    date_hierarchy = "started_at"
    list_select_related = ["user", "session"]
    fields = [
        "id",
        "organization",
        "user",
        "session",
        "status",
        "width",
        "height",
        "size",
        "started_at",
        "ended_at",
        "end_reason",
        "download",
    ]
    readonly_fields = fields

    @admin.display(description="asciicast")
    def download(self, recording):
        if recording.status != TerminalRecording.Status.ENDED:
            return "recording…"
        url = reverse("terminal-recording-audit", args=[recording.pk])
        return format_html('<a href="{}" download>Download</a>', url)


class SkillForm(forms.ModelForm):
    """The Skill's bundle edited as JSON (relative path → text); saving it stores a new
    bundle in the file store."""

    files = forms.JSONField(
        initial=dict,
        required=False,
        help_text='Relative path → text content, e.g. {"SKILL.md": "...", "run.py": "..."}.',
    )

    class Meta:
        model = Skill
        fields = ["organization", "name", "description"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.instance.pk:
            return
        try:
            files = skill_files(self.instance)
        except CorruptBlob as exc:  # the admin can enter the files again
            self.fields["files"].help_text = f"{exc.message} Enter the files again."
            return
        self.initial["files"] = {path: data.decode() for path, data in files.items()}

    def clean_files(self):
        try:
            return clean_skill_files(self.cleaned_data["files"] or {})
        except QuorError as exc:
            raise forms.ValidationError(exc.message) from None


@admin.register(Skill)
class SkillAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    """Skill bundles can contain executable scripts: review them as code before adding."""

    form = SkillForm
    list_display = ["name", "organization", "description", "updated_at"]
    list_filter = ["organization"]
    search_fields = ["name", "description"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        skill_set_files(skill=obj, files=form.cleaned_data["files"])


@admin.register(LibraryFile)
class LibraryFileAdmin(admin.ModelAdmin):
    list_display = ["path", "owner", "size", "updated_at"]
    search_fields = ["path", "owner__email"]
    list_select_related = ["owner", "blob"]
    fields = ["owner", "path", "sha256", "updated_at"]
    readonly_fields = ["sha256", "updated_at"]

    @admin.display(description="Size")
    def size(self, obj):
        return obj.blob.size
