"""The Apps API: every member reads the organization's Apps and manages their own
credential; organization admins add and change Apps, policies and the organization's
credential. Each view: access helper, service call, response."""

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from apps import selectors, services
from apps.api.serializers import (
    ActionPolicySerializer,
    AppActionSerializer,
    AppCreateSerializer,
    AppSerializer,
    AppUpdateSerializer,
    CatalogAppSerializer,
    CredentialClearSerializer,
    CredentialSetSerializer,
)
from apps.catalog import load_catalog
from apps.models import App
from quor.lib.pagination import CursorPagination, ListPagination
from quor.lib.permissions import Permission, require_permission

APP_ID = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)
SCOPE = OpenApiParameter(
    "scope", OpenApiTypes.STR, OpenApiParameter.QUERY, enum=["user", "organization"]
)


def _app_data(user, apps):
    """Serialized App (or Apps) with whether the organization's and the user's own
    credential are set, from one query; a secret is never read into a response."""
    many = not isinstance(apps, App)
    items = list(apps) if many else [apps]
    context = {"credentials": selectors.credentials_set(user, items), "user_id": user.pk}
    return AppSerializer(items if many else apps, many=many, context=context).data


class AppCatalogView(APIView):
    """The built-in Apps an organization admin can add, with their actions and
    default policies, by key (paginated)."""

    required_permission = Permission.ACCOUNT
    pagination_class = CursorPagination

    @extend_schema(responses=CatalogAppSerializer(many=True))
    def get(self, request):
        pages = ListPagination(request)
        membership = require_permission(request.user, Permission.ACCOUNT)
        added = selectors.catalog_apps_added(membership.organization)
        return pages.response(
            load_catalog().values(),
            key=lambda entry: (entry.key,),
            serialize=lambda page: (
                CatalogAppSerializer(page, many=True, context={"added": added}).data
            ),
        )


class AppViewSet(viewsets.ViewSet):
    required_permissions = {
        "list": Permission.ACCOUNT,
        "retrieve": Permission.ACCOUNT,
        "create": Permission.ORGANIZATION_MANAGE,
        "partial_update": Permission.ORGANIZATION_MANAGE,
    }
    serializer_class = AppSerializer
    pagination_class = CursorPagination
    lookup_value_regex = r"\d+"

    def list(self, request):
        """The organization's Apps (disabled ones only for those who may read the
        organization's configuration), oldest first (paginated)."""
        pages = CursorPagination(request, ordering=("id",))
        return pages.response(
            selectors.apps_with_actions_visible_to(request.user),
            lambda page: _app_data(request.user, page),
        )

    @extend_schema(parameters=[APP_ID])
    def retrieve(self, request, pk=None):
        app = services.get_app_for_member(request.user, pk)
        return Response(_app_data(request.user, app))

    @extend_schema(request=AppCreateSerializer, responses={201: AppSerializer})
    def create(self, request):
        """Organization admins: add a built-in App ({"catalog_key": "github"}) or a
        custom one (name, url_patterns, credential_style, ...)."""
        membership = require_permission(request.user, Permission.ORGANIZATION_MANAGE)
        serializer = AppCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        with transaction.atomic():
            if "catalog_key" in data:
                app = services.app_enable_builtin(
                    organization=membership.organization,
                    catalog_key=data.pop("catalog_key"),
                    url_patterns=data.pop("url_patterns", None),
                )
                app = services.app_update(app=app, **data)
            else:
                app = services.app_create_custom(organization=membership.organization, **data)
        return Response(_app_data(request.user, app), status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[APP_ID], request=AppUpdateSerializer, responses=AppSerializer)
    def partial_update(self, request, pk=None):
        """Organization admins: change the App's name, URL patterns, enabled, ..."""
        app = services.get_app_for_admin(request.user, pk)
        serializer = AppUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        app = services.app_update(app=app, **serializer.validated_data)
        return Response(_app_data(request.user, app))


class AppActionPolicyView(APIView):
    required_permission = Permission.ORGANIZATION_MANAGE

    @extend_schema(request=ActionPolicySerializer, responses=AppActionSerializer)
    def patch(self, request, app_id, key):
        """Organization admins: set one action's policy (auto, ask or deny)."""
        app = services.get_app_for_admin(request.user, app_id)
        serializer = ActionPolicySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        action = services.app_set_action_policy(
            app=app, key=key, policy=serializer.validated_data["policy"]
        )
        return Response(AppActionSerializer(action).data)


class AppCredentialView(APIView):
    """Write-only credentials. `scope: "user"` is the requesting member's own token
    (used for their sessions, before the organization's); `scope: "organization"` is
    the organization's, for organization admins."""

    required_permission = Permission.SANDBOX_USE

    def _app_for_scope(self, request, app_id, scope):
        if scope == "organization":
            return services.get_app_for_admin(request.user, app_id), None
        return services.get_app_for_member(request.user, app_id), request.user

    @extend_schema(request=CredentialSetSerializer, responses=AppSerializer)
    def put(self, request, app_id):
        services.get_app_for_member(request.user, app_id)  # 404 before any 400
        serializer = CredentialSetSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        app, user = self._app_for_scope(request, app_id, data["scope"])
        services.app_credential_set(app=app, user=user, secret=data["secret"])
        return Response(_app_data(request.user, app))

    @extend_schema(parameters=[SCOPE], request=CredentialClearSerializer, responses={204: None})
    def delete(self, request, app_id):
        """Removes the credential (the scope in the body or the query; user by default)."""
        services.get_app_for_member(request.user, app_id)
        data = request.data if request.data else {}
        if "scope" not in data and "scope" in request.query_params:
            data = {"scope": request.query_params["scope"]}
        serializer = CredentialClearSerializer(data=data)
        serializer.is_valid(raise_exception=True)
        app, user = self._app_for_scope(request, app_id, serializer.validated_data["scope"])
        services.app_credential_clear(app=app, user=user)
        return Response(status=status.HTTP_204_NO_CONTENT)
