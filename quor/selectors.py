"""Reads of organizations, their members and groups, providers and models."""

from dataclasses import dataclass

from django.db.models import Q

from quor.lib.ids import is_database_id
from quor.models import Membership, ModelProvider, OrganizationGroup


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
