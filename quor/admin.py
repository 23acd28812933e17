from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group
from django.db.models import Count
from django.utils import timezone

from quor import email_domains, services
from quor.lib.errors import QuorError
from quor.lib.permissions import Permission, check_role_change, role_has
from quor.models import (
    ApiToken,
    AuditEntry,
    EmailDomain,
    Membership,
    ModelProvider,
    Organization,
    SingleSignOn,
    User,
)
from quor.sso import issuer_is_allowed


class ReadOnlyAdmin:
    """A record, not something to edit: nobody adds, changes or deletes it here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class OrganizationAdminAccess:
    """Superusers see everything; in an organization, the roles that may read its
    configuration see its own rows only, and those that may change it change them
    (quor/lib/permissions.py)."""

    organization_field = "organization"
    admin_permissions = {
        "view": Permission.ORGANIZATION_VIEW,
        "add": Permission.ORGANIZATION_MANAGE,
        "change": Permission.ORGANIZATION_MANAGE,
        "delete": Permission.ORGANIZATION_MANAGE,
    }
    """What each role needs for each of the admin's actions; None: superusers only."""

    def _membership_with(self, request, permission):
        membership = getattr(request.user, "membership", None)
        if (
            request.user.is_active
            and membership
            and membership.organization.is_active
            and role_has(membership.role, permission)
        ):
            return membership
        return None

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        membership = self._membership_with(request, Permission.ORGANIZATION_VIEW)
        if membership is None:
            return queryset.none()
        return queryset.filter(**{self.organization_field: membership.organization})

    def _allowed(self, request, action):
        if request.user.is_superuser:
            return True
        permission = self.admin_permissions[action]
        return permission is not None and self._membership_with(request, permission) is not None

    def has_module_permission(self, request):
        return self._allowed(request, "view")

    secret_fields = ()
    """Fields a read-only view must not show (Django shows every field there)."""

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if self.has_change_permission(request, obj):
            return fields
        return [field for field in fields if field not in self.secret_fields]

    def _limit_to_own_organization(self, request, form):
        """An organization's editor picks only their own organization in the form; their
        membership, or None for a superuser or a read-only view."""
        membership = self._membership_with(request, Permission.ORGANIZATION_VIEW)
        if (
            request.user.is_superuser
            or membership is None
            or "organization" not in form.base_fields  # absent from a read-only view
        ):
            return None
        organization_field = form.base_fields["organization"]
        organization_field.queryset = Organization.objects.filter(pk=membership.organization_id)
        organization_field.initial = membership.organization_id
        return membership

    def get_list_filter(self, request):
        """An organization admin must not even see the names of other organizations."""
        filters = super().get_list_filter(request)
        if request.user.is_superuser:
            return filters
        return [f for f in filters if f != self.organization_field]

    def has_view_permission(self, request, obj=None):
        return self._allowed(request, "view")

    def has_change_permission(self, request, obj=None):
        return self._allowed(request, "change")

    def has_add_permission(self, request):
        return self._allowed(request, "add")

    def has_delete_permission(self, request, obj=None):
        return self._allowed(request, "delete")


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "is_active", "sandbox_enabled", "member_count", "created_at"]
    list_filter = ["is_active", "sandbox_enabled"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(ordering="member_count", description="Members")
    def member_count(self, obj):
        return obj.member_count


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    ordering = ["email"]
    list_display = [
        "email",
        "full_name",
        "organization",
        "role",
        "is_staff",
        "is_active",
        "last_login",
    ]
    list_filter = [
        "is_staff",
        "is_superuser",
        "is_active",
        "membership__organization",
        "membership__role",
    ]
    search_fields = ["email", "full_name"]
    list_select_related = ["membership__organization"]
    fieldsets = (
        (None, {"fields": ("email", "password")}),
        ("Personal info", {"fields": ("full_name",)}),
        (
            "Permissions",
            {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")},
        ),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = ((None, {"classes": ("wide",), "fields": ("email", "password1", "password2")}),)

    def save_model(self, request, obj, form, change):
        """Deactivation and reactivation go through their services (the fan-out)."""
        if not (change and "is_active" in form.changed_data):
            return super().save_model(request, obj, form, change)
        activate = obj.is_active
        obj.is_active = not activate
        super().save_model(request, obj, form, change)
        change_activity = services.user_reactivate if activate else services.user_deactivate
        change_activity(user=obj, actor=request.user, via="admin")
        return None

    def delete_model(self, request, obj):
        services.user_delete(user=obj, actor=request.user, via="admin")

    def delete_queryset(self, request, queryset):
        for user in queryset:
            services.user_delete(user=user, actor=request.user, via="admin")

    @admin.display(ordering="membership__organization__name")
    def organization(self, obj):
        membership = getattr(obj, "membership", None)
        return membership.organization if membership else "—"

    @admin.display(ordering="membership__role")
    def role(self, obj):
        membership = getattr(obj, "membership", None)
        return membership.get_role_display() if membership else "—"


@admin.register(Membership)
class MembershipAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    list_display = ["user", "organization", "role", "can_use_sandbox", "is_active", "created_at"]
    list_filter = ["role", "can_use_sandbox", "user__is_active", "organization"]
    search_fields = ["user__email", "organization__name"]
    list_select_related = ["user", "organization"]
    autocomplete_fields = ["user"]
    actions = ["deactivate_members", "reactivate_members"]
    admin_permissions = {
        **OrganizationAdminAccess.admin_permissions,
        "add": None,  # a member is added with their user (create_member, SCIM, SSO)
        "delete": None,
    }

    @admin.display(boolean=True, ordering="user__is_active", description="Active")
    def is_active(self, obj):
        return obj.user.is_active

    @admin.action(permissions=["change"], description="Deactivate selected members")
    def deactivate_members(self, request, queryset):
        self._set_active(request, queryset, False)

    @admin.action(permissions=["change"], description="Reactivate selected members")
    def reactivate_members(self, request, queryset):
        self._set_active(request, queryset, True)

    def _set_active(self, request, queryset, is_active: bool) -> None:
        """Member by member: one the editor may not manage is reported, the rest done."""
        for membership in queryset:
            try:
                services.member_update(
                    membership=membership, actor=request.user, is_active=is_active
                )
            except QuorError as exc:
                self.message_user(request, f"{membership.user}: {exc.message}", messages.ERROR)

    def get_readonly_fields(self, request, obj=None):
        """A membership is not moved: its user and organization are set once."""
        return ["user", "organization"] if obj is not None or not request.user.is_superuser else []

    def save_model(self, request, obj, form, change):
        if not change:
            return super().save_model(request, obj, form, change)
        services.member_update(
            membership=obj,
            actor=request.user,
            role=form.cleaned_data["role"],
            can_use_sandbox=form.cleaned_data["can_use_sandbox"],
        )
        return None

    def get_form(self, request, obj=None, **kwargs):
        """The role field refuses what the editor may not give (check_role_change)."""
        form = super().get_form(request, obj, **kwargs)
        editor = request.user

        class RoleCheckedForm(form):
            def clean_role(self):
                role = self.cleaned_data["role"]
                if self.instance.pk and role != self.instance.role:
                    try:
                        check_role_change(editor, self.instance, role)
                    except QuorError as exc:
                        raise forms.ValidationError(exc.message) from None
                return role

        return RoleCheckedForm


class ModelProviderForm(forms.ModelForm):
    """The API key is write-only: the form never shows it, and an empty field keeps it."""

    api_key = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave empty to keep the stored key.",
    )
    base_url = forms.URLField(
        required=False, assume_scheme="https", help_text="Leave empty for the official API."
    )
    model_names = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="One model name per line, e.g. claude-sonnet-4-5.",
    )

    class Meta:
        model = ModelProvider
        fields = [
            "organization",
            "kind",
            "display_name",
            "base_url",
            "api_key",
            "model_names",
            "available_to_everyone",
            "allowed_users",
            "allowed_groups",
        ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial["api_key"] = ""
        if self.instance.pk:
            self.initial["model_names"] = "\n".join(self.instance.model_names)
            if self.instance.has_api_key:
                self.fields["api_key"].help_text = (
                    "A key is stored. " + self.fields["api_key"].help_text
                )

    def clean_model_names(self):
        names = [line.strip() for line in self.cleaned_data["model_names"].splitlines()]
        names = [name for name in names if name]
        if not names:
            raise forms.ValidationError("Give at least one model name.")
        return list(dict.fromkeys(names))

    def clean_api_key(self):
        new_key = self.cleaned_data.get("api_key")
        if not new_key and self.instance.pk:
            return ModelProvider.objects.get(pk=self.instance.pk).api_key
        return new_key


@admin.register(ModelProvider)
class ModelProviderAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    form = ModelProviderForm
    secret_fields = ("api_key",)
    list_display = [
        "display_name",
        "kind",
        "organization",
        "key_set",
        "models",
        "available_to_everyone",
        "updated_at",
    ]
    list_filter = ["kind", "available_to_everyone", "organization"]
    search_fields = ["display_name", "organization__name", "organization__slug"]
    list_select_related = ["organization"]
    filter_horizontal = ["allowed_users", "allowed_groups"]

    @admin.display(boolean=True, description="API key set")
    def key_set(self, obj):
        return obj.has_api_key

    @admin.display(description="Models")
    def models(self, obj):
        return ", ".join(obj.model_names)

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        membership = self._limit_to_own_organization(request, form)
        if membership is not None:
            form.base_fields["allowed_users"].queryset = User.objects.filter(
                membership__organization=membership.organization
            )
            form.base_fields["allowed_groups"].queryset = Group.objects.filter(
                organization_group__organization=membership.organization
            )
        return form


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created by their owner (API or create_api_token) and shown once."""

    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at", "created_at"]
    search_fields = ["name", "user__email", "prefix"]
    list_select_related = ["user"]
    fields = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin, OrganizationAdminAccess, admin.ModelAdmin):
    """Who changed what and when, from which request; kept QUOR_AUDIT_RETENTION_DAYS."""

    admin_permissions = {
        "view": Permission.AUDIT_VIEW,
        "add": None,
        "change": None,
        "delete": None,
    }
    list_display = ["created_at", "actor_label", "action", "target_label", "request_id"]
    list_filter = ["action", "created_at", "organization"]
    search_fields = ["actor_label", "target_label", "target_id", "request_id"]
    date_hierarchy = "created_at"
    list_select_related = ["organization"]
    fields = [
        "created_at", "organization", "actor_label", "action", "target_type", "target_id",
        "target_label", "changes", "request_id",
    ]  # fmt: skip


class SingleSignOnForm(forms.ModelForm):
    """The client secret is write-only, like a model provider's key."""

    client_secret = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave empty to keep the stored secret.",
    )
    issuer = forms.URLField(
        assume_scheme="https", help_text=SingleSignOn._meta.get_field("issuer").help_text
    )

    class Meta:
        model = SingleSignOn
        fields = [
            "organization",
            "enabled",
            "issuer",
            "client_id",
            "client_secret",
            "scopes",
            "email_claim",
            "require_verified_email",
            "name_claim",
            "groups_claim",
            "role_claim",
            "creates_users",
            "password_login",
        ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial["client_secret"] = ""
        if self.instance.pk and self.instance.has_client_secret:
            self.fields["client_secret"].help_text = (
                "A secret is stored. " + self.fields["client_secret"].help_text
            )

    def clean_issuer(self):
        issuer = self.cleaned_data["issuer"]
        if not issuer_is_allowed(issuer):
            raise forms.ValidationError("The issuer must be an https:// address.")
        return issuer

    def clean_client_secret(self):
        new_secret = self.cleaned_data.get("client_secret")
        if not new_secret and self.instance.pk:
            return SingleSignOn.objects.get(pk=self.instance.pk).client_secret
        return new_secret

    def clean_scopes(self):
        scopes = self.cleaned_data["scopes"].split()
        if "openid" not in scopes:
            raise forms.ValidationError("The scopes must include openid.")
        return " ".join(dict.fromkeys(scopes))

    def clean(self):
        cleaned = super().clean()
        if not cleaned.get("password_login") and not cleaned.get("enabled"):
            raise forms.ValidationError(
                "Password login can be turned off only while single sign-on is enabled."
            )
        return cleaned


@admin.register(SingleSignOn)
class SingleSignOnAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    """Owners only change it: the role claim gives the admin role, so configuring single
    sign-on is giving roles (Permission.ADMINS_MANAGE)."""

    form = SingleSignOnForm
    secret_fields = ("client_secret",)
    admin_permissions = {
        "view": Permission.ORGANIZATION_VIEW,
        "add": Permission.ADMINS_MANAGE,
        "change": Permission.ADMINS_MANAGE,
        "delete": Permission.ADMINS_MANAGE,
    }
    list_display = ["organization", "enabled", "issuer", "creates_users", "password_login"]
    list_filter = ["enabled", "organization"]
    list_select_related = ["organization"]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        self._limit_to_own_organization(request, form)
        return form


class EmailDomainForm(forms.ModelForm):
    class Meta:
        model = EmailDomain
        fields = ["organization", "domain"]

    def clean_domain(self):
        try:
            return email_domains.clean_domain(self.cleaned_data["domain"])
        except QuorError as exc:
            raise forms.ValidationError(exc.message) from None


@admin.register(EmailDomain)
class EmailDomainAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    """Owners claim, verify and remove domains (who is created at a domain is as much
    theirs as single sign-on is); admins and auditors read them."""

    form = EmailDomainForm
    admin_permissions = {
        "view": Permission.ORGANIZATION_VIEW,
        "add": Permission.ADMINS_MANAGE,
        "change": Permission.ADMINS_MANAGE,
        "delete": Permission.ADMINS_MANAGE,
    }
    list_display = ["domain", "organization", "verified_at", "created_at"]
    list_filter = ["organization"]
    search_fields = ["domain"]
    list_select_related = ["organization"]
    actions = ["verify_selected"]
    readonly_fields = ["record_name", "record_value", "verified_at", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return ["organization", "domain", *self.readonly_fields]

    def get_fields(self, request, obj=None):
        return self.get_readonly_fields(request, obj) if obj else ["organization", "domain"]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        self._limit_to_own_organization(request, form)
        return form

    @admin.display(description="TXT record name")
    def record_name(self, obj):
        return obj.record_name

    @admin.display(description="TXT record value")
    def record_value(self, obj):
        return obj.record_value

    def save_model(self, request, obj, form, change):
        """A claim is made by its service (token, audit); the form checked it first."""
        if change:
            return
        claim = email_domains.email_domain_claim(
            organization=obj.organization, domain=obj.domain, actor=request.user
        )
        obj.pk, obj.token, obj.created_at = claim.pk, claim.token, claim.created_at

    def delete_model(self, request, obj):
        email_domains.email_domain_remove(claim=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for claim in queryset:
            email_domains.email_domain_remove(claim=claim, actor=request.user)

    @admin.action(permissions=["change"], description="Verify selected domains (DNS TXT record)")
    def verify_selected(self, request, queryset):
        for claim in queryset:
            try:
                email_domains.email_domain_verify(claim=claim, actor=request.user)
            except QuorError as exc:
                self.message_user(request, f"{claim.domain}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{claim.domain} is verified.", messages.SUCCESS)
