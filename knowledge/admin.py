"""Knowledge in the Django admin: sources with their sync state and errors, uploads,
re-index and sync actions, and documents with their access lists. Every write goes
through knowledge.services, so an access list is checked and reaches the chunks at once,
and a directory or S3 location is checked against what the operator allowed."""

from django import forms
from django.contrib import admin, messages
from django.db.models import Count

from knowledge import locations, services, sync
from knowledge.models import KnowledgeDocument, KnowledgeSource
from quor.admin import OrganizationAdminAccess
from quor.lib.errors import QuorError

ACCESS_HELP = (
    "One principal per line: user:&lt;id&gt; (a member), group:&lt;id&gt; (a group), "
    "org:&lt;id&gt; (everyone in the organization). Empty means nobody."
)


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


class SourceForm(forms.ModelForm):
    access_text = forms.CharField(
        label="Default access", widget=forms.Textarea(attrs={"rows": 3}), required=False,
        help_text=ACCESS_HELP + " Given to documents added from now on.",
    )  # fmt: skip
    upload = forms.FileField(
        required=False, help_text="Add a file: PDF, Word (.docx), HTML, Markdown or text."
    )

    admins_organization = None  # set by the admin for an organization admin's form

    class Meta:
        model = KnowledgeSource
        fields = ["organization", "name", "kind", "location"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["access_text"].initial = "\n".join(self.instance.default_access or [])

    def clean(self):
        cleaned = super().clean()
        if self.instance.organization_id:
            organization = self.instance.organization
        else:
            organization = self.admins_organization or cleaned.get("organization")
        if organization is None:
            return cleaned  # the organization field says what is missing
        name = (cleaned.get("name") or "").strip()
        taken = KnowledgeSource.objects.filter(organization=organization, name=name)
        if name and taken.exclude(pk=self.instance.pk).exists():
            self.add_error("name", f"There is already a source named {name!r}.")
        try:
            cleaned["access"] = services.validate_access(
                organization, _lines(cleaned.get("access_text", ""))
            )
        except QuorError as error:
            self.add_error("access_text", error.message)
        if not self.instance.pk and cleaned.get("kind"):
            try:
                cleaned["location"] = locations.source_location(
                    organization, cleaned["kind"], cleaned.get("location", "")
                )
            except QuorError as error:
                self.add_error("location", error.message)
        return cleaned


@admin.register(KnowledgeSource)
class KnowledgeSourceAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    form = SourceForm
    list_display = ["name", "organization", "kind", "sync_state", "document_count", "synced_at"]
    list_filter = ["organization", "sync_state"]
    readonly_fields = ["sync_state", "sync_error", "synced_at"]
    actions = ["reindex", "sync_now"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(documents_count=Count("documents"))

    @admin.display(description="Documents", ordering="documents_count")
    def document_count(self, obj):
        return obj.documents_count

    def get_fields(self, request, obj=None):
        fields = ["name", "kind", "location", "access_text"]
        if obj is None or obj.kind == KnowledgeSource.Kind.UPLOAD:
            fields.append("upload")
        fields += ["sync_state", "sync_error", "synced_at"]
        return (["organization"] if request.user.is_superuser else []) + fields

    def get_readonly_fields(self, request, obj=None):
        """A source never moves to another organization: its documents' group
        principals would open them to that organization's members of those groups. Its
        kind and location are set once: its documents are the files found there."""
        return [*self.readonly_fields, *(["organization", "kind", "location"] if obj else [])]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if not request.user.is_superuser:
            form.admins_organization = request.user.membership.organization
        return form

    def save_model(self, request, obj, form, change):
        if not obj.organization_id:
            obj.organization = form.admins_organization or form.cleaned_data["organization"]
        obj.default_access = form.cleaned_data["access"]
        super().save_model(request, obj, form, change)
        if not change and obj.kind in KnowledgeSource.SYNCED_KINDS:
            sync.source_request_sync(obj)
            messages.success(request, f"{obj.name} is being synced.")
        upload = form.cleaned_data.get("upload")
        if upload:
            try:
                services.document_upload(source=obj, upload=upload)
            except QuorError as error:
                messages.error(request, f"{upload.name}: {error.message}")
            else:
                messages.success(request, f"{upload.name} is being indexed.")

    @admin.action(description="Index the selected sources' documents again")
    def reindex(self, request, queryset):
        count = sum(services.source_reindex(source) for source in queryset)
        messages.success(request, f"{count} documents are being indexed again.")

    @admin.action(description="Sync now")
    def sync_now(self, request, queryset):
        synced = queryset.filter(kind__in=KnowledgeSource.SYNCED_KINDS)
        for source in synced:
            sync.source_request_sync(source)
        messages.success(request, f"{len(synced)} sources are being synced.")
        if len(synced) < len(queryset):
            messages.warning(request, "Upload sources have nothing to sync.")


class DocumentForm(forms.ModelForm):
    access_text = forms.CharField(
        label="Access", widget=forms.Textarea(attrs={"rows": 4}), required=False,
        help_text=ACCESS_HELP,
    )  # fmt: skip

    class Meta:
        model = KnowledgeDocument
        fields = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["access_text"].initial = "\n".join(self.instance.access or [])

    def clean(self):
        cleaned = super().clean()
        try:
            cleaned["access"] = services.validate_access(
                self.instance.source.organization, _lines(cleaned.get("access_text", ""))
            )
        except QuorError as error:
            self.add_error("access_text", error.message)
        return cleaned


@admin.register(KnowledgeDocument)
class KnowledgeDocumentAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    organization_field = "source__organization"
    form = DocumentForm
    list_display = ["title", "source", "content_type", "state", "size", "source_updated_at"]
    list_filter = ["state", "content_type"]
    search_fields = ["title", "external_id"]
    fields = [
        "title", "source", "external_id", "url", "content_type", "size", "content_sha256",
        "source_updated_at", "access_text", "access_changed_at", "state", "error",
    ]  # fmt: skip
    readonly_fields = [f for f in fields if f != "access_text"]
    admin_permissions = {
        **OrganizationAdminAccess.admin_permissions,
        "add": None,  # documents come from their sources
    }

    def save_model(self, request, obj, form, change):
        services.document_set_access(obj, form.cleaned_data["access"])

    def delete_model(self, request, obj):
        services.document_delete(obj)
