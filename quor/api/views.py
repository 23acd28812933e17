from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from quor import selectors, services
from quor.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    MeSerializer,
    ModelProviderSerializer,
    ModelSerializer,
)
from quor.lib.errors import NotFound
from quor.lib.pagination import NEWEST_FIRST, CursorPagination, ListPagination
from quor.lib.permissions import Permission, get_active_membership, require_permission
from quor.models import ModelProvider


class MeView(APIView):
    required_permission = Permission.ACCOUNT

    @extend_schema(responses=MeSerializer)
    def get(self, request):
        return Response(MeSerializer(request.user).data)


def get_organization_model_provider(user, provider_id, permission) -> ModelProvider:
    """A provider of the user's own organization; any other is 404."""
    membership = require_permission(user, permission)
    provider = ModelProvider.objects.filter(
        organization=membership.organization, pk=provider_id
    ).first()
    if provider is None:
        raise NotFound("No such model provider.")
    return provider


class ModelProviderViewSet(viewsets.ViewSet):
    """Organization admins manage their organization's model providers; auditors read them."""

    required_permissions = {
        "list": Permission.ORGANIZATION_VIEW,
        "retrieve": Permission.ORGANIZATION_VIEW,
        "create": Permission.ORGANIZATION_MANAGE,
        "partial_update": Permission.ORGANIZATION_MANAGE,
        "destroy": Permission.ORGANIZATION_MANAGE,
    }
    serializer_class = ModelProviderSerializer
    pagination_class = CursorPagination
    lookup_value_regex = r"\d+"

    def list(self, request):
        """The organization's model providers, oldest first (paginated)."""
        pages = CursorPagination(request, ordering=("id",))
        membership = require_permission(request.user, Permission.ORGANIZATION_VIEW)
        providers = ModelProvider.objects.filter(organization=membership.organization)
        return pages.response(providers, lambda page: ModelProviderSerializer(page, many=True).data)

    def retrieve(self, request, pk=None):
        provider = get_organization_model_provider(request.user, pk, Permission.ORGANIZATION_VIEW)
        return Response(ModelProviderSerializer(provider).data)

    def create(self, request):
        membership = require_permission(request.user, Permission.ORGANIZATION_MANAGE)
        serializer = ModelProviderSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        provider = services.model_provider_create(
            organization=membership.organization, **serializer.validated_data
        )
        return Response(ModelProviderSerializer(provider).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        provider = get_organization_model_provider(request.user, pk, Permission.ORGANIZATION_MANAGE)
        serializer = ModelProviderSerializer(provider, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        provider = services.model_provider_update(provider=provider, **serializer.validated_data)
        return Response(ModelProviderSerializer(provider).data)

    def destroy(self, request, pk=None):
        provider = get_organization_model_provider(request.user, pk, Permission.ORGANIZATION_MANAGE)
        services.model_provider_delete(provider=provider)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelListView(APIView):
    """The models the requesting member may choose for a session, by provider id, then
    model name (paginated)."""

    required_permission = Permission.SANDBOX_USE
    pagination_class = CursorPagination

    @extend_schema(responses=ModelSerializer(many=True))
    def get(self, request):
        pages = ListPagination(request)
        membership = get_active_membership(request.user)
        choices = selectors.models_available_to(request.user, membership.organization)
        return pages.response(
            choices,
            key=lambda choice: (choice.provider.pk, choice.name),
            serialize=lambda page: ModelSerializer(page, many=True).data,
        )


class ApiTokenViewSet(viewsets.ViewSet):
    required_permission = Permission.ACCOUNT
    serializer_class = ApiTokenSerializer
    pagination_class = CursorPagination
    lookup_value_regex = r"\d+"

    def list(self, request):
        """The user's tokens, revoked ones too, newest first (paginated)."""
        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        return pages.response(
            request.user.api_tokens.all(),
            lambda page: ApiTokenSerializer(page, many=True).data,
        )

    def retrieve(self, request, pk=None):
        token = request.user.api_tokens.filter(pk=pk).first()
        if token is None:
            raise NotFound("No such token.")
        return Response(ApiTokenSerializer(token).data)

    @extend_schema(request=ApiTokenCreateSerializer, responses=ApiTokenCreatedSerializer)
    def create(self, request):
        serializer = ApiTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, raw_token = services.api_token_create(
            user=request.user, name=serializer.validated_data["name"]
        )
        token.token = raw_token
        return Response(ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.api_token_revoke(user=request.user, token_id=int(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
