from rest_framework import serializers

from quor.lib.serializers import StrictModelSerializer, StrictSerializer
from quor.models import (
    ApiToken,
    Membership,
    ModelProvider,
    Organization,
    OrganizationGroup,
    ServiceAccount,
    ServiceAccountToken,
    User,
)


class MeSerializer(serializers.Serializer):
    email = serializers.EmailField()
    full_name = serializers.CharField()
    organization = serializers.CharField(source="membership.organization.slug")
    role = serializers.CharField(source="membership.role")
    can_use_sandbox = serializers.BooleanField(source="membership.can_use_sandbox")


class ModelProviderSerializer(StrictModelSerializer):
    """api_key is write-only: responses say only whether one is set."""

    api_key = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        trim_whitespace=True,
        style={"input_type": "password"},
    )
    has_api_key = serializers.BooleanField(read_only=True)
    effective_base_url = serializers.CharField(read_only=True)
    model_names = serializers.ListField(child=serializers.CharField(max_length=200), max_length=200)
    allowed_users = serializers.SlugRelatedField(
        slug_field="email", many=True, required=False, queryset=User.objects.all()
    )

    class Meta:
        model = ModelProvider
        fields = [
            "id",
            "kind",
            "display_name",
            "base_url",
            "effective_base_url",
            "api_key",
            "has_api_key",
            "model_names",
            "available_to_everyone",
            "allowed_users",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]


class ModelSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    provider_id = serializers.IntegerField(source="provider.pk")
    provider_kind = serializers.CharField(source="provider.kind")
    provider_name = serializers.CharField(source="provider.display_name")


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = fields


class ApiTokenCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class OperatorOrganizationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Organization
        fields = ["id", "slug", "name", "is_active", "sandbox_enabled", "created_at"]
        read_only_fields = fields


class OrganizationCreateSerializer(StrictSerializer):
    slug = serializers.SlugField(max_length=50)
    name = serializers.CharField(max_length=200)


class OrganizationUpdateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200, required=False)
    is_active = serializers.BooleanField(required=False)
    sandbox_enabled = serializers.BooleanField(required=False)


class OperatorMemberSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)
    is_active = serializers.BooleanField(source="user.is_active", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "email", "role", "can_use_sandbox", "is_active", "created_at"]
        read_only_fields = fields


class MemberCreateSerializer(StrictSerializer):
    email = serializers.EmailField(max_length=254)
    role = serializers.ChoiceField(choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    can_use_sandbox = serializers.BooleanField(default=True)


class MemberUpdateSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=Membership.Role.choices, required=False)
    can_use_sandbox = serializers.BooleanField(required=False)
    is_active = serializers.BooleanField(
        required=False,
        help_text="false ends the member's access at once: login sessions, API tokens, "
        "running turns, parked approvals; their sandbox goes to sleep.",
    )


class ServiceAccountSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = ServiceAccount
        fields = ["id", "name", "email", "scopes", "created_at", "disabled_at"]
        read_only_fields = fields


class ServiceAccountCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ServiceAccount.Scope.choices), allow_empty=False
    )


class ServiceAccountUpdateSerializer(StrictSerializer):
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ServiceAccount.Scope.choices), allow_empty=False
    )


class ServiceAccountTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServiceAccountToken
        fields = ["id", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]
        read_only_fields = fields


class ServiceAccountTokenCreateSerializer(StrictSerializer):
    lifetime_days = serializers.IntegerField(min_value=1, max_value=365, default=90)


class ServiceAccountTokenCreatedSerializer(ServiceAccountTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once.")

    class Meta(ServiceAccountTokenSerializer.Meta):
        fields = [*ServiceAccountTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class MemberSerializer(serializers.ModelSerializer):
    """A member by the id knowledge access lists take (`principal`)."""

    id = serializers.IntegerField(source="user_id", read_only=True)
    principal = serializers.SerializerMethodField()
    email = serializers.EmailField(source="user.email", read_only=True)
    full_name = serializers.CharField(source="user.full_name", read_only=True)
    is_active = serializers.BooleanField(source="user.is_active", read_only=True)
    is_service_account = serializers.SerializerMethodField()

    class Meta:
        model = Membership
        fields = [
            "id", "principal", "email", "full_name", "role", "is_active",
            "is_service_account", "external_id", "created_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_principal(self, membership) -> str:
        return f"user:{membership.user_id}"

    def get_is_service_account(self, membership) -> bool:
        return hasattr(membership.user, "service_account")


class GroupSerializer(serializers.ModelSerializer):
    """A group by the id knowledge access lists and model providers take, with its
    members' ids."""

    id = serializers.IntegerField(source="group_id", read_only=True)
    principal = serializers.SerializerMethodField()
    members = serializers.SerializerMethodField()

    class Meta:
        model = OrganizationGroup
        fields = ["id", "principal", "display_name", "external_id", "members", "created_at"]
        read_only_fields = fields

    def get_principal(self, organization_group) -> str:
        return f"group:{organization_group.group_id}"

    def get_members(self, organization_group) -> list[int]:
        return sorted(user.pk for user in organization_group.group.user_set.all())
