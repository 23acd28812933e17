from rest_framework import serializers

from apps.catalog import catalog_app
from apps.models import App, AppAction, Policy
from quor.lib.serializers import StrictSerializer


class CatalogActionSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    methods = serializers.ListField(child=serializers.CharField(), help_text="Empty: any method.")
    paths = serializers.ListField(child=serializers.CharField())
    default_policy = serializers.CharField(help_text="auto, ask or deny (the policy's values).")


class CatalogAppSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="Give it as catalog_key to add this App.")
    name = serializers.CharField()
    description = serializers.CharField()
    url_patterns = serializers.ListField(child=serializers.CharField())
    credential_style = serializers.ChoiceField(choices=App.CredentialStyle.choices)
    credential_header = serializers.CharField()
    credential_help = serializers.CharField(help_text="What credential to give and where.")
    agent_env = serializers.CharField(help_text="The variable tools read the token from.")
    actions = CatalogActionSerializer(many=True)
    app_id = serializers.SerializerMethodField(
        help_text="The id of the organization's App made from it, or null if not added."
    )

    def get_app_id(self, entry) -> int | None:
        return self.context.get("added", {}).get(entry.key)


class AppActionSerializer(serializers.ModelSerializer):
    class Meta:
        model = AppAction
        fields = ["key", "name", "description", "methods", "paths", "policy"]
        read_only_fields = fields


class AppSerializer(serializers.ModelSerializer):
    """An App as members see it. Credentials are never returned: only whether the
    organization's and the requesting user's own are set."""

    custom = serializers.BooleanField(source="is_custom", read_only=True)
    actions = AppActionSerializer(many=True, read_only=True)
    agent_env = serializers.SerializerMethodField()
    has_organization_credential = serializers.SerializerMethodField()
    has_my_credential = serializers.SerializerMethodField()

    class Meta:
        model = App
        fields = [
            "id",
            "catalog_key",
            "custom",
            "name",
            "description",
            "enabled",
            "url_patterns",
            "credential_style",
            "credential_header",
            "when_not_selected",
            "agent_env",
            "actions",
            "has_organization_credential",
            "has_my_credential",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_agent_env(self, app) -> str:
        entry = catalog_app(app.catalog_key) if app.catalog_key else None
        return entry.agent_env if entry else ""

    def get_has_organization_credential(self, app) -> bool:
        return (app.pk, None) in self.context["credentials"]

    def get_has_my_credential(self, app) -> bool:
        return (app.pk, self.context["user_id"]) in self.context["credentials"]


class AppCreateSerializer(StrictSerializer):
    """Either {"catalog_key": "github"} (a built-in App: its URL patterns, credential
    style and actions come from the catalog unless given) or a custom App (name and
    url_patterns required)."""

    catalog_key = serializers.CharField(required=False, help_text="From /api/v1/apps/catalog/.")
    name = serializers.CharField(required=False, max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)
    url_patterns = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        max_length=20,
        help_text="https://host[:port][/base/path]; the host may be *.domain.",
    )
    credential_style = serializers.ChoiceField(choices=App.CredentialStyle.choices, required=False)
    credential_header = serializers.CharField(required=False, allow_blank=True, max_length=100)
    when_not_selected = serializers.ChoiceField(choices=App.WhenNotSelected.choices, required=False)

    def validate(self, data):
        if "catalog_key" not in data:
            missing = [name for name in ("name", "url_patterns") if name not in data]
            if missing:
                raise serializers.ValidationError(
                    {name: ["Required for a custom App (or give catalog_key)."] for name in missing}
                )
        return data


class AppUpdateSerializer(StrictSerializer):
    name = serializers.CharField(required=False, max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)
    url_patterns = serializers.ListField(
        child=serializers.CharField(), required=False, max_length=20
    )
    credential_style = serializers.ChoiceField(choices=App.CredentialStyle.choices, required=False)
    credential_header = serializers.CharField(required=False, allow_blank=True, max_length=100)
    when_not_selected = serializers.ChoiceField(choices=App.WhenNotSelected.choices, required=False)


class ActionPolicySerializer(StrictSerializer):
    policy = serializers.ChoiceField(choices=Policy.choices)


SCOPES = [("user", "Your own credential"), ("organization", "The organization's (admins)")]


class CredentialSetSerializer(StrictSerializer):
    scope = serializers.ChoiceField(choices=SCOPES, default="user")
    secret = serializers.CharField(
        write_only=True,
        max_length=8192,
        style={"input_type": "password"},
        help_text="Write-only: never returned. user:token for basic-auth Apps (Jira).",
    )


class CredentialClearSerializer(StrictSerializer):
    scope = serializers.ChoiceField(choices=SCOPES, default="user")
