"""What organization admins do about public links in the admin site: allow them or not,
mark sessions confidential, see every link with who opened it, and revoke links. Changes
go through webapps.services, which audits them."""

from django.contrib import admin, messages
from django.utils import timezone

from quor.admin import OrganizationAdminAccess, ReadOnlyAdmin
from quor.lib.permissions import Permission
from webapps import services
from webapps.models import PublicLink, PublicLinkPolicy, PublicLinkVisit, SessionConfidentiality

CHANGE_ONLY = {
    "view": Permission.ORGANIZATION_VIEW,
    "add": None,
    "change": Permission.ORGANIZATION_MANAGE,
    "delete": None,
}


@admin.register(PublicLinkPolicy)
class PublicLinkPolicyAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    admin_permissions = CHANGE_ONLY
    list_display = ["name", "allow_public_links"]
    fields = ["name", "allow_public_links"]
    readonly_fields = ["name"]

    def get_queryset(self, request):
        """The organization itself is the row: its admins see only their own."""
        queryset = admin.ModelAdmin.get_queryset(self, request)
        if request.user.is_superuser:
            return queryset
        membership = self._membership_with(request, Permission.ORGANIZATION_VIEW)
        return queryset.filter(pk=membership.organization_id) if membership else queryset.none()

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        services.organization_set_public_links(
            actor=request.user, organization=obj, allowed=obj.allow_public_links
        )


@admin.register(SessionConfidentiality)
class SessionConfidentialityAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    organization_field = "owner__membership__organization"
    admin_permissions = CHANGE_ONLY
    list_display = ["__str__", "owner_email", "confidential", "created_at"]
    list_filter = ["confidential"]
    search_fields = ["title", "owner__email"]
    list_select_related = ["owner"]
    # The owner is shown as text: the user admin is for superusers only.
    fields = ["title", "owner_email", "created_at", "confidential"]
    readonly_fields = ["title", "owner_email", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Owner", ordering="owner__email")
    def owner_email(self, obj):
        return obj.owner.email

    def save_model(self, request, obj, form, change):
        services.session_set_confidential(
            actor=request.user, session=obj, confidential=obj.confidential
        )


class PublicLinkVisitInline(ReadOnlyAdmin, admin.TabularInline):
    model = PublicLinkVisit
    fields = ["opened_at", "address", "authenticated_by", "email", "user_agent"]
    readonly_fields = fields
    extra = 0


@admin.register(PublicLink)
class PublicLinkAdmin(ReadOnlyAdmin, OrganizationAdminAccess, admin.ModelAdmin):
    """Every link of the organization and who opened it; admins revoke them here."""

    organization_field = "webapp__session__owner__membership__organization"
    admin_permissions = {**CHANGE_ONLY, "change": None}
    list_display = ["label", "creator", "visitor_auth", "expires_at", "revoked_at"]
    list_filter = ["visitor_auth"]
    fields = [
        "label",
        "creator",
        "visitor_auth",
        "email_domains",
        "requests_per_minute",
        "bandwidth_bytes",
        "created_at",
        "expires_at",
        "revoked_at",
    ]
    readonly_fields = fields
    inlines = [PublicLinkVisitInline]
    actions = ["revoke"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("created_by", "webapp")

    @admin.display(description="Made by", ordering="created_by__email")
    def creator(self, obj):
        return obj.created_by.email

    def has_revoke_permission(self, request):
        return self._allowed(request, "view") and (
            request.user.is_superuser
            or self._membership_with(request, Permission.ORGANIZATION_MANAGE) is not None
        )

    @admin.action(description="Revoke the selected links", permissions=["revoke"])
    def revoke(self, request, queryset):
        links = list(queryset.filter(revoked_at__isnull=True, expires_at__gt=timezone.now()))
        for link in links:
            services.public_link_revoke(user=request.user, link=link)
        self.message_user(request, f"{len(links)} link(s) revoked.", messages.SUCCESS)
