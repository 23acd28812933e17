"""The web apps' REST API: a session's web apps and public links, public links and
their visits, and local relay tunnels."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from quor.lib.pagination import NEWEST_FIRST, CursorPagination
from quor.lib.permissions import Permission
from quor.models import ServiceAccount
from sandboxes.runtime.services import session_in_use
from webapps import selectors, services, tunnels
from webapps.api.serializers import (
    PublicLinkCreateSerializer,
    PublicLinkSerializer,
    PublicLinkVisitSerializer,
    TunnelSerializer,
    TunnelUpdateSerializer,
    WebAppSerializer,
)

SESSION_ID = OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH)
LINK_ID = OpenApiParameter("link_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
TUNNEL_ID = OpenApiParameter("tunnel_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


class SessionWebAppsView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.SESSIONS
    pagination_class = CursorPagination

    @extend_schema(parameters=[SESSION_ID], responses=WebAppSerializer(many=True))
    def get(self, request, pk):
        """The web apps the agent started in this session (owner only), by port
        (paginated)."""
        pages = CursorPagination(request, ordering=("port",))
        session = session_in_use(request.user, pk)
        return pages.response(
            selectors.webapps_of(session), lambda page: [services.webapp_payload(w) for w in page]
        )


class SessionPublicLinksView(APIView):
    """The session's public links still in force, newest first (paginated); POST
    makes one for a web app of the session, where the organization allows them and
    the session is not confidential (owner only)."""

    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.SESSIONS
    pagination_class = CursorPagination

    @extend_schema(parameters=[SESSION_ID], responses=PublicLinkSerializer(many=True))
    def get(self, request, pk):
        session = session_in_use(request.user, pk)
        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        return pages.response(
            selectors.public_links_of(session),
            lambda page: (
                PublicLinkSerializer(
                    [services.public_link_payload(link) for link in page], many=True
                ).data
            ),
        )

    @extend_schema(
        parameters=[SESSION_ID],
        request=PublicLinkCreateSerializer,
        responses={201: PublicLinkSerializer},
    )
    def post(self, request, pk):
        session = session_in_use(request.user, pk)
        serializer = PublicLinkCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        link = services.public_link_create(
            user=request.user, session=session, webapp_id=data.pop("webapp"), **data
        )
        payload = PublicLinkSerializer(services.public_link_payload(link)).data
        return Response(payload, status=status.HTTP_201_CREATED)


class PublicLinkView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.SESSIONS

    @extend_schema(parameters=[LINK_ID], responses=PublicLinkSerializer)
    def get(self, request, link_id):
        link = selectors.get_public_link_for_owner(request.user, link_id)
        return Response(PublicLinkSerializer(services.public_link_payload(link)).data)

    @extend_schema(parameters=[LINK_ID], responses={204: None})
    def delete(self, request, link_id):
        """Revokes the link at once: visitors' next requests are refused, and its open
        WebSockets close within 5 s. A revoked link is gone from the API."""
        link = selectors.get_public_link_for_owner(request.user, link_id)
        services.public_link_revoke(user=request.user, link=link)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PublicLinkVisitsView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.SESSIONS
    pagination_class = CursorPagination

    @extend_schema(parameters=[LINK_ID], responses=PublicLinkVisitSerializer(many=True))
    def get(self, request, link_id):
        """Who opened the link, newest first (paginated)."""
        link = selectors.get_public_link_for_owner(request.user, link_id)
        pages = CursorPagination(request, ordering=("-opened_at", "-id"))
        return pages.response(
            selectors.visits_of(link),
            lambda page: PublicLinkVisitSerializer(page, many=True).data,
        )


class TunnelListView(APIView):
    """Your open local relay tunnels (`quor tunnel PORT`), newest first (paginated).
    Personal API tokens only."""

    required_permission = Permission.SANDBOX_USE
    pagination_class = CursorPagination

    @extend_schema(responses=TunnelSerializer(many=True))
    def get(self, request):
        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        return pages.response(
            tunnels.tunnels_of(request.user),
            lambda page: TunnelSerializer(map(tunnels.tunnel_payload, page), many=True).data,
        )


class TunnelView(APIView):
    required_permission = Permission.SANDBOX_USE

    @extend_schema(parameters=[TUNNEL_ID], responses=TunnelSerializer)
    def get(self, request, tunnel_id):
        tunnel = tunnels.get_tunnel_for_owner(request.user, tunnel_id)
        return Response(TunnelSerializer(tunnels.tunnel_payload(tunnel)).data)

    @extend_schema(
        parameters=[TUNNEL_ID], request=TunnelUpdateSerializer, responses=TunnelSerializer
    )
    def patch(self, request, tunnel_id):
        """Shares the tunnel with your organization, or makes it private again."""
        tunnel = tunnels.get_tunnel_for_owner(request.user, tunnel_id)
        serializer = TunnelUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        tunnel = tunnels.tunnel_set_sharing(
            user=request.user, tunnel=tunnel, sharing=serializer.validated_data["sharing"]
        )
        return Response(TunnelSerializer(tunnels.tunnel_payload(tunnel)).data)

    @extend_schema(parameters=[TUNNEL_ID], responses={204: None})
    def delete(self, request, tunnel_id):
        """Closes the tunnel: its route is gone at once, its client disconnected."""
        tunnel = tunnels.get_tunnel_for_owner(request.user, tunnel_id)
        tunnels.tunnel_end(user=request.user, tunnel=tunnel)
        return Response(status=status.HTTP_204_NO_CONTENT)
