"""Apps in the Django admin: organization admins add built-in or custom Apps, set each
action's policy and the organization's credential. Every write goes through
apps.services; the forms run the same checks first so that bad input is a form
error, and the credential is write-only."""

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Exists, OuterRef
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from apps import services
from apps.catalog import catalog_app, load_catalog
from apps.models import App, AppAction, AppCredential, Policy
from quor.admin import OrganizationAdminAccess
from quor.lib.errors import QuorError
from quor.lib.permissions import Permission
from quor.models import Organization

CUSTOM = "_custom"  # catalog keys start with a letter

POLICY_HELP = (
    "<strong>Auto-approve</strong>: sent with the credential. <strong>Ask</strong>: the "
    "session's user approves it first (or the scheduled task pre-approved the App). "
    "<strong>Deny</strong>: always refused. A request that matches no action is Ask."
)
URL_PATTERNS_HELP = (
    "One per line: https://host[:port][/base/path]; the host may be *.domain (e.g. "
    "https://*.atlassian.net), though your own site is safer. Action paths are relative "
    "to the base path."
)
CREDENTIAL_HELP = (
    "Quor adds the credential to the sandbox's allowed requests; it never enters the "
    "sandbox and is never shown again. A member's own token (connected on the Apps page) "
    "is used before the organization's."
)


def _add_help() -> str:
    links = format_html_join(
        " · ",
        '<a href="?source={}">{}</a>',
        ((entry.key, entry.name) for entry in load_catalog().values()),
    )
    return format_html(
        "An App is a service such as GitHub or Slack that sandboxes reach through Quor's "
        "egress proxy. Pick a built-in App ({}): its URL and its actions with sensible "
        "default policies come from Quor's catalog, and you can change each policy after "
        "saving. Or choose <em>Custom App</em> for any other HTTP API: every request to it "
        "is Ask.",
        links,
    )


class AppForm(forms.ModelForm):
    source = forms.ChoiceField(
        label="App",
        help_text="A built-in App from the catalog, or a custom App.",
    )
    url_patterns_text = forms.CharField(
        label="URL patterns",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=URL_PATTERNS_HELP,
    )
    organization_credential = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave empty to keep the stored credential.",
    )
    remove_credential = forms.BooleanField(
        required=False, label="Remove the organization credential"
    )

    class Meta:
        model = App
        fields = [
            "organization",
            "name",
            "description",
            "enabled",
            "when_not_selected",
            "credential_style",
            "credential_header",
        ]
        help_texts = {
            "enabled": "Disabled Apps are invisible to members and get no credential.",
            "credential_style": "How Quor sends the credential to the App.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial["organization_credential"] = ""
        if "name" in self.fields:
            self.fields["name"].required = False
        if self.instance.pk:
            del self.fields["source"]
            self.initial["url_patterns_text"] = "\n".join(self.instance.url_patterns)
            self.fields["url_patterns_text"].help_text = URL_PATTERNS_HELP
            has_credential = AppCredential.objects.filter(
                app=self.instance, user__isnull=True
            ).exists()
            status = "An organization credential is set." if has_credential else "Not set."
            self.fields[
                "organization_credential"
            ].help_text = f"{status} {self.fields['organization_credential'].help_text}"
            if not has_credential:
                del self.fields["remove_credential"]
        else:
            del self.fields["remove_credential"]
            self.fields["name"].help_text = "Empty for a built-in App: the catalog's name."
            self.fields[
                "url_patterns_text"
            ].help_text = f"{URL_PATTERNS_HELP} Empty for a built-in App: the catalog's."
            self.fields["credential_style"].help_text = (
                "For a custom App; a built-in App's comes from the catalog (change it later "
                "if needed)."
            )
            self.fields["source"].choices = [
                ("", "---------"),
                *((entry.key, f"{entry.name} (built-in)") for entry in load_catalog().values()),
                (CUSTOM, "Custom App"),
            ]
            self.fields["organization_credential"].help_text = (
                "Write-only; optional (members can connect their own tokens instead). For "
                "basic authentication (Jira): email:api-token."
            )

    def _check(self, field, key, check, *args, **kwargs):
        """Runs a services check: its result goes to cleaned_data[key], its error to
        the field's form errors."""
        try:
            self.cleaned_data[key] = check(*args, **kwargs)
        except QuorError as exc:
            self.add_error(field, exc.message)

    def clean(self):
        data = super().clean()
        adding = not self.instance.pk
        organization = data.get("organization") if adding else self.instance.organization
        source = data.get("source", "") if adding else self.instance.catalog_key
        entry = catalog_app(source) if source and source != CUSTOM else None
        lines = [line.strip() for line in data.get("url_patterns_text", "").splitlines()]
        lines = [line for line in lines if line]
        if adding and entry is not None:
            lines = lines or list(entry.url_patterns)
            data["credential_style"] = entry.credential_style
            data["credential_header"] = entry.credential_header
        self._check("url_patterns_text", "url_patterns", services.clean_url_patterns, lines)
        added = App.objects.filter(organization=organization, catalog_key=source)
        if adding and entry is not None and organization is not None and added.exists():
            self.add_error("source", f"{entry.name} is already added.")
            # Without a name the model's unique check is skipped: it would only add a
            # vaguer "App with this Organization and Name already exists."
            data.pop("name", None)
            return data
        if organization is not None:
            name = (data.get("name") or "").strip() or (entry.name if entry else "")
            self._check(
                "name",
                "name",
                services.clean_name,
                name,
                organization=organization,
                exclude_pk=self.instance.pk,
            )
        style = data.get("credential_style")
        if style:
            header = data.get("credential_header", "")
            self._check(
                "credential_header", "credential", services.clean_credential_style, style, header
            )
            if "credential" in data:
                data["credential_style"], data["credential_header"] = data.pop("credential")
        secret = data.get("organization_credential")
        if secret and data.get("remove_credential"):
            self.add_error("remove_credential", "Either give a new credential or remove it.")
        elif secret and style:
            self._check(
                "organization_credential",
                "organization_credential",
                services.clean_secret,
                secret,
                credential_style=style,
            )
        return data


class AppActionForm(forms.ModelForm):
    policy = forms.ChoiceField(
        choices=Policy.choices, help_text="Auto-approve, Ask (the user approves) or Deny."
    )

    class Meta:
        model = AppAction
        fields = ["policy"]


class AppActionInline(OrganizationAdminAccess, admin.TabularInline):
    """A built-in App's actions: the catalog says what they are, the organization
    chooses their policies."""

    model = AppAction
    form = AppActionForm
    organization_field = "app__organization"
    fields = ["name", "requests", "policy"]
    readonly_fields = ["name", "requests"]
    ordering = ["name"]
    extra = 0
    can_delete = False
    verbose_name = "action"
    verbose_name_plural = "Actions and their policies"

    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Requests")
    def requests(self, action):
        methods = " ".join(action.methods) or "any method"
        paths = format_html_join(", ", "<code>{}</code>", ((p,) for p in action.paths))
        if action.description:
            return format_html("{} {}<br>{}", methods, paths, action.description)
        return format_html("{} {}", methods, paths)


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [("builtin", "Built-in"), ("custom", "Custom")]

    def queryset(self, request, queryset):
        if self.value() == "builtin":
            return queryset.exclude(catalog_key="")
        if self.value() == "custom":
            return queryset.filter(catalog_key="")
        return queryset


@admin.register(App)
class AppAdmin(OrganizationAdminAccess, admin.ModelAdmin):
    form = AppForm
    list_display = ["name", "kind", "enabled", "action_count", "credential_set"]
    list_filter = ["enabled", KindFilter, "organization"]
    search_fields = ["name", "catalog_key", "organization__name", "organization__slug"]
    list_select_related = ["organization"]
    readonly_fields = ["kind"]
    actions = ["sync_with_catalog"]

    def get_queryset(self, request):
        organization_credential = AppCredential.objects.filter(
            app=OuterRef("pk"), user__isnull=True
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                action_count=Count("actions"),
                credential_set=Exists(organization_credential),
            )
        )

    def get_list_display(self, request):
        if request.user.is_superuser:
            return [*self.list_display[:1], "organization", *self.list_display[1:]]
        return self.list_display

    def get_readonly_fields(self, request, obj=None):
        return ["kind", "organization"] if obj else ["kind"]

    def get_inlines(self, request, obj):
        return [AppActionInline] if obj is not None and not obj.is_custom else []

    def get_fieldsets(self, request, obj=None):
        details = ["name", "description", "url_patterns_text", "enabled", "when_not_selected"]
        credential = ["credential_style", "credential_header", "organization_credential"]
        if obj is None:
            return [
                (None, {"description": _add_help(), "fields": ["organization", "source"]}),
                ("About the App", {"fields": details}),
                ("Credential", {"description": CREDENTIAL_HELP, "fields": credential}),
            ]
        if AppCredential.objects.filter(app=obj, user__isnull=True).exists():
            credential.append("remove_credential")
        if obj.is_custom:
            about = "A custom App: every request to it is Ask."
        else:
            about = format_html(
                "{} Its actions are listed below with your policy for each: {}",
                obj.description,
                mark_safe(POLICY_HELP),  # noqa: S308 (a constant of this module)
            )
        return [
            (None, {"description": about, "fields": ["organization", "kind", *details]}),
            ("Credential", {"description": CREDENTIAL_HELP, "fields": credential}),
        ]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        membership = self._membership_with(request, Permission.ORGANIZATION_VIEW)
        if "organization" in form.base_fields and not request.user.is_superuser and membership:
            field = form.base_fields["organization"]
            field.queryset = Organization.objects.filter(pk=membership.organization_id)
            field.initial = membership.organization_id
        return form

    def get_changeform_initial_data(self, request):
        """`?source=github` fills the add form from the catalog."""
        initial = super().get_changeform_initial_data(request)
        entry = catalog_app(request.GET.get("source", ""))
        if entry is not None:
            initial.update(
                name=entry.name,
                description=entry.description,
                url_patterns_text="\n".join(entry.url_patterns),
                credential_style=entry.credential_style,
                credential_header=entry.credential_header,
            )
        return initial

    @admin.display(description="Kind", ordering="catalog_key")
    def kind(self, obj):
        if obj is None or obj.pk is None:
            return "—"
        if obj.is_custom:
            return "Custom"
        entry = catalog_app(obj.catalog_key)
        return f"Built-in: {entry.name if entry else obj.catalog_key}"

    @admin.display(description="Actions", ordering="action_count")
    def action_count(self, obj):
        return obj.action_count

    @admin.display(boolean=True, description="Organization credential set")
    def credential_set(self, obj):
        return obj.credential_set

    def save_model(self, request, obj, form, change):
        """Through the services (the form ran their checks already)."""
        data = form.cleaned_data
        details = {
            "name": data["name"],
            "description": data.get("description", ""),
            "enabled": data.get("enabled", False),
            "when_not_selected": data["when_not_selected"],
        }
        if change:
            app = services.app_update(
                app=App.objects.get(pk=obj.pk),
                url_patterns=data["url_patterns"],
                credential_style=data["credential_style"],
                credential_header=data.get("credential_header", ""),
                **details,
            )
        elif data["source"] == CUSTOM:
            app = services.app_create_custom(
                organization=data["organization"],
                url_patterns=data["url_patterns"],
                credential_style=data["credential_style"],
                credential_header=data.get("credential_header", ""),
                **details,
            )
        else:
            app = services.app_enable_builtin(
                organization=data["organization"],
                catalog_key=data["source"],
                url_patterns=data["url_patterns"],
            )
            app = services.app_update(app=app, **details)
        if data.get("organization_credential"):
            services.app_credential_set(app=app, user=None, secret=data["organization_credential"])
        elif data.get("remove_credential"):
            services.app_credential_clear(app=app, user=None)
        for field in App._meta.concrete_fields:  # the admin goes on with `obj`
            setattr(obj, field.attname, getattr(app, field.attname))
        obj._state.adding, obj._state.db = False, app._state.db

    def save_formset(self, request, form, formset, change):
        """Policies change through the service, one action at a time."""
        if formset.model is not AppAction:
            return super().save_formset(request, form, formset, change)
        changed = []
        for action_form in formset.forms:
            if action_form.has_changed() and action_form.instance.pk:
                action = services.app_set_action_policy(
                    app=form.instance,
                    key=action_form.instance.key,
                    policy=action_form.cleaned_data["policy"],
                )
                changed.append((action, ["policy"]))
        # What the admin's history message reads.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], changed, []
        return None

    @admin.action(description="Update from the catalog (keeps the policies)")
    def sync_with_catalog(self, request, queryset):
        for app in queryset:
            if app.is_custom:
                continue
            try:
                result = services.app_sync_catalog(app=app)
            except QuorError as exc:
                self.message_user(request, f"{app.name}: {exc.message}", messages.ERROR)
                continue
            if result.changed:
                summary = ", ".join(
                    f"{label} {', '.join(keys)}"
                    for label, keys in (
                        ("added", result.added),
                        ("updated", result.updated),
                        ("removed", result.removed),
                    )
                    if keys
                )
                self.message_user(request, f"{app.name}: {summary}.", messages.SUCCESS)
            else:
                self.message_user(request, f"{app.name} is up to date.", messages.INFO)

    def view_on_site(self, obj):
        return reverse("app-list") + f"#app-{obj.pk}"
