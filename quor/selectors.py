"""Reads of organizations, their members and groups, providers and models."""

from dataclasses import dataclass

from django.db.models import Q

from quor.lib.errors import NotFound
from quor.lib.ids import is_database_id
from quor.models import Membership, ModelProvider, Organization, OrganizationGroup, ServiceAccount


@dataclass(frozen=True)
class ModelChoice:
    """One model of one provider, as members choose it: id is `<provider id>:<model name>`."""

    provider: ModelProvider
    name: str

    @property
    def id(self) -> str:
        return make_model_id(self.provider.pk, self.name)


def make_model_id(provider_id: int, model_name: str) -> str:
    return f"{provider_id}:{model_name}"


def model_providers_available_to(user, organization):
    return (
        ModelProvider.objects.filter(organization=organization)
        .filter(
            Q(available_to_everyone=True)
            | Q(allowed_users=user)
            | Q(allowed_groups__in=user.groups.all())
        )
        .distinct()
        .order_by("display_name", "pk")
    )


def model_provider_is_available_to(provider: ModelProvider, user) -> bool:
    return (
        model_providers_available_to(user, provider.organization_id).filter(pk=provider.pk).exists()
    )


def models_available_to(user, organization) -> list[ModelChoice]:
    return [
        ModelChoice(provider=provider, name=name)
        for provider in model_providers_available_to(user, organization)
        for name in provider.model_names
    ]


def find_model(*, organization, model_id: str) -> ModelChoice | None:
    provider_id, sep, name = str(model_id).partition(":")
    if not sep or not is_database_id(provider_id):
        return None
    provider = ModelProvider.objects.filter(organization=organization, pk=int(provider_id)).first()
    if provider is None or name not in provider.model_names:
        return None
    return ModelChoice(provider=provider, name=name)


def all_organizations():
    return Organization.objects.all()


def get_organization_by_slug(slug) -> Organization:
    organization = Organization.objects.filter(slug=slug).first()
    if organization is None:
        raise NotFound("No such organization.", code="organizations.not_found")
    return organization


def get_organization_member(organization, member_id) -> Membership:
    """A membership of this organization; any other is 404."""
    membership = Membership.objects.filter(organization=organization, pk=member_id).first()
    if membership is None:
        raise NotFound("No such member.", code="members.not_found")
    return membership


def organization_members(organization):
    """The organization's members, service accounts included (they may be named in
    access lists too)."""
    return Membership.objects.filter(organization=organization).select_related(
        "user", "user__service_account"
    )


def organization_groups(organization):
    return OrganizationGroup.objects.filter(organization=organization).prefetch_related(
        "group__user_set"
    )


def model_providers_of(organization):
    return ModelProvider.objects.filter(organization=organization)


def model_provider_of(organization, provider_id) -> ModelProvider | None:
    """A provider of this organization; None for any other."""
    return model_providers_of(organization).filter(pk=provider_id).first()


def api_tokens_of(user):
    """The user's personal API tokens, revoked ones too."""
    return user.api_tokens.all()


def working_api_tokens_of(user):
    """The user's personal API tokens that are not revoked."""
    return user.api_tokens.filter(revoked_at__isnull=True)


def get_working_api_token(user, token_id):
    """One of the user's tokens that is not revoked; any other is 404."""
    token = working_api_tokens_of(user).filter(pk=token_id).first()
    if token is None:
        raise NotFound("No such token.")
    return token


def service_accounts_of(organization):
    return ServiceAccount.objects.filter(organization=organization).select_related("user")


def service_account_tokens(account: ServiceAccount):
    """The account's tokens, revoked and expired ones too."""
    return account.tokens.all()
