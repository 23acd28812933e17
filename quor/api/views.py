from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from quor import selectors, service_accounts, services
from quor.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    GroupSerializer,
    MemberSerializer,
    MeSerializer,
    ModelProviderSerializer,
    ModelSerializer,
    ServiceAccountCreateSerializer,
    ServiceAccountSerializer,
    ServiceAccountTokenCreatedSerializer,
    ServiceAccountTokenCreateSerializer,
    ServiceAccountTokenSerializer,
    ServiceAccountUpdateSerializer,
)
from quor.lib.errors import NotFound
from quor.lib.pagination import NEWEST_FIRST, CursorPagination, ListPagination
from quor.lib.permissions import Permission, get_active_membership, require_permission
from quor.models import ModelProvider, ServiceAccount


class MeView(APIView):
    required_permission = Permission.ACCOUNT

    @extend_schema(responses=MeSerializer)
    def get(self, request):
        return Response(MeSerializer(request.user).data)


def get_organization_model_provider(user, provider_id, permission) -> ModelProvider:
    """A provider of the user's own organization; any other is 404."""
    membership = require_permission(user, permission)
    provider = selectors.model_provider_of(membership.organization, provider_id)
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
        providers = selectors.model_providers_of(membership.organization)
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


class MemberListView(APIView):
    """The organization's members, oldest first (paginated): the ids that knowledge
    access lists take (`principal`)."""

    required_permission = Permission.ORGANIZATION_VIEW
    pagination_class = CursorPagination

    @extend_schema(responses=MemberSerializer(many=True))
    def get(self, request):
        pages = CursorPagination(request, ordering=("id",))
        membership = require_permission(request.user, Permission.ORGANIZATION_VIEW)
        return pages.response(
            selectors.organization_members(membership.organization),
            lambda page: MemberSerializer(page, many=True).data,
        )


class GroupListView(APIView):
    """The organization's groups with their members' ids, oldest first (paginated)."""

    required_permission = Permission.ORGANIZATION_VIEW
    pagination_class = CursorPagination

    @extend_schema(responses=GroupSerializer(many=True))
    def get(self, request):
        pages = CursorPagination(request, ordering=("id",))
        membership = require_permission(request.user, Permission.ORGANIZATION_VIEW)
        return pages.response(
            selectors.organization_groups(membership.organization),
            lambda page: GroupSerializer(page, many=True).data,
        )


class ApiTokenViewSet(viewsets.ViewSet):
    required_permission = Permission.ACCOUNT
    serializer_class = ApiTokenSerializer
    pagination_class = CursorPagination
    lookup_value_regex = r"\d+"

    def list(self, request):
        """The user's tokens that work, newest first (paginated). A revoked token is gone
        from the API (docs/decisions.md); the tokens page still shows it as revoked."""
        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        return pages.response(
            selectors.working_api_tokens_of(request.user),
            lambda page: ApiTokenSerializer(page, many=True).data,
        )

    def retrieve(self, request, pk=None):
        token = selectors.get_working_api_token(request.user, pk)
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
        """Revokes the token: from then on it is 404 here, and 401 as a credential."""
        selectors.get_working_api_token(request.user, pk)
        services.api_token_revoke(user=request.user, token_id=int(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ServiceAccountListView(APIView):
    """The organization's service accounts: integrations with scoped, expiring tokens."""

    required_permissions = {
        "get": Permission.ORGANIZATION_VIEW,
        "post": Permission.ORGANIZATION_MANAGE,
    }
    pagination_class = CursorPagination

    @extend_schema(responses=ServiceAccountSerializer(many=True))
    def get(self, request):
        """Oldest first (paginated)."""
        membership = require_permission(request.user, Permission.ORGANIZATION_VIEW)
        pages = CursorPagination(request, ordering=("id",))
        return pages.response(
            selectors.service_accounts_of(membership.organization),
            lambda page: ServiceAccountSerializer(page, many=True).data,
        )

    @extend_schema(
        request=ServiceAccountCreateSerializer, responses={201: ServiceAccountSerializer}
    )
    def post(self, request):
        membership = require_permission(request.user, Permission.ORGANIZATION_MANAGE)
        serializer = ServiceAccountCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        account = service_accounts.service_account_create(
            organization=membership.organization, actor=request.user, **serializer.validated_data
        )
        return Response(ServiceAccountSerializer(account).data, status=status.HTTP_201_CREATED)


def _service_account(request, account_id, permission) -> ServiceAccount:
    membership = require_permission(request.user, permission)
    return service_accounts.get_service_account(membership.organization, account_id)


class ServiceAccountView(APIView):
    required_permissions = {
        "get": Permission.ORGANIZATION_VIEW,
        "patch": Permission.ORGANIZATION_MANAGE,
        "delete": Permission.ORGANIZATION_MANAGE,
    }

    @extend_schema(responses=ServiceAccountSerializer)
    def get(self, request, account_id):
        account = _service_account(request, account_id, Permission.ORGANIZATION_VIEW)
        return Response(ServiceAccountSerializer(account).data)

    @extend_schema(request=ServiceAccountUpdateSerializer, responses=ServiceAccountSerializer)
    def patch(self, request, account_id):
        """Replaces the account's scopes; they hold for its tokens' next request."""
        account = _service_account(request, account_id, Permission.ORGANIZATION_MANAGE)
        serializer = ServiceAccountUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        account = service_accounts.service_account_update(
            account=account, actor=request.user, **serializer.validated_data
        )
        return Response(ServiceAccountSerializer(account).data)

    @extend_schema(responses={204: None})
    def delete(self, request, account_id):
        """Disables the account: its tokens stop working; its sessions stay."""
        account = _service_account(request, account_id, Permission.ORGANIZATION_MANAGE)
        service_accounts.service_account_disable(account=account)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ServiceAccountTokenListView(APIView):
    required_permissions = {
        "get": Permission.ORGANIZATION_VIEW,
        "post": Permission.ORGANIZATION_MANAGE,
    }
    pagination_class = CursorPagination

    @extend_schema(responses=ServiceAccountTokenSerializer(many=True))
    def get(self, request, account_id):
        """The account's tokens, newest first, revoked and expired ones too (paginated)."""
        account = _service_account(request, account_id, Permission.ORGANIZATION_VIEW)
        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        return pages.response(
            selectors.service_account_tokens(account),
            lambda page: ServiceAccountTokenSerializer(page, many=True).data,
        )

    @extend_schema(
        request=ServiceAccountTokenCreateSerializer,
        responses={201: ServiceAccountTokenCreatedSerializer},
    )
    def post(self, request, account_id):
        """A new token, shown once. To rotate, make one, switch the integration to it,
        then revoke the old one."""
        account = _service_account(request, account_id, Permission.ORGANIZATION_MANAGE)
        serializer = ServiceAccountTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, raw_token = service_accounts.service_account_token_create(
            account=account, actor=request.user, **serializer.validated_data
        )
        token.token = raw_token
        return Response(
            ServiceAccountTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED
        )


class ServiceAccountTokenView(APIView):
    required_permission = Permission.ORGANIZATION_MANAGE

    @extend_schema(responses={204: None})
    def delete(self, request, account_id, token_id):
        account = _service_account(request, account_id, Permission.ORGANIZATION_MANAGE)
        service_accounts.service_account_token_revoke(account=account, token_id=token_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
