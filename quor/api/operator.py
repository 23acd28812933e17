"""The operator API (/api/operator/v1/): deployment automation with the operator token,
across organizations. Every call is in the audit log (`operator.request`), beside what
its services record."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from quor import audit, health, selectors, services
from quor.api.serializers import (
    MemberCreateSerializer,
    MemberUpdateSerializer,
    OperatorMemberSerializer,
    OperatorOrganizationSerializer,
    OrganizationCreateSerializer,
    OrganizationUpdateSerializer,
)
from quor.lib.authentication import OperatorTokenAuthentication
from quor.lib.pagination import CursorPagination
from quor.lib.permissions import OPERATOR
from quor.lib.streaming import StreamedResponse


class OperatorView(APIView):
    authentication_classes = [OperatorTokenAuthentication]
    required_permission = OPERATOR

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if getattr(request.user, "is_operator", False):
            audit.audit_record(
                "operator.request",
                actor=request.user,
                changes={
                    "method": request.method,
                    "path": request.path,
                    "status": response.status_code,
                },
            )
        return response


class OrganizationListView(OperatorView):
    pagination_class = CursorPagination

    @extend_schema(responses=OperatorOrganizationSerializer(many=True))
    def get(self, request):
        """Every organization, oldest first (paginated)."""
        pages = CursorPagination(request, ordering=("id",))
        return pages.response(
            selectors.all_organizations(),
            lambda page: OperatorOrganizationSerializer(page, many=True).data,
        )

    @extend_schema(
        request=OrganizationCreateSerializer, responses={201: OperatorOrganizationSerializer}
    )
    def post(self, request):
        serializer = OrganizationCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        organization = services.organization_create(**serializer.validated_data)
        return Response(
            OperatorOrganizationSerializer(organization).data, status=status.HTTP_201_CREATED
        )


class OrganizationView(OperatorView):
    @extend_schema(responses=OperatorOrganizationSerializer)
    def get(self, request, slug):
        return Response(
            OperatorOrganizationSerializer(selectors.get_organization_by_slug(slug)).data
        )

    @extend_schema(request=OrganizationUpdateSerializer, responses=OperatorOrganizationSerializer)
    def patch(self, request, slug):
        """Rename, disable (its members can no longer use Quor) or take Sandbox away."""
        organization = selectors.get_organization_by_slug(slug)
        serializer = OrganizationUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        organization = services.organization_update(
            organization=organization, **serializer.validated_data
        )
        return Response(OperatorOrganizationSerializer(organization).data)


class MemberListView(OperatorView):
    pagination_class = CursorPagination

    @extend_schema(responses=OperatorMemberSerializer(many=True))
    def get(self, request, slug):
        """The organization's members, oldest first (paginated)."""
        organization = selectors.get_organization_by_slug(slug)
        pages = CursorPagination(request, ordering=("id",))
        members = selectors.organization_members(organization)
        return pages.response(members, lambda page: OperatorMemberSerializer(page, many=True).data)

    @extend_schema(request=MemberCreateSerializer, responses={201: OperatorMemberSerializer})
    def post(self, request, slug):
        """A new member, without a password (they sign in through single sign-on, or an
        admin sets one)."""
        organization = selectors.get_organization_by_slug(slug)
        serializer = MemberCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = services.member_create(organization=organization, **serializer.validated_data)
        return Response(
            OperatorMemberSerializer(user.membership).data, status=status.HTTP_201_CREATED
        )


class MemberView(OperatorView):
    @extend_schema(request=MemberUpdateSerializer, responses=OperatorMemberSerializer)
    def patch(self, request, slug, member_id):
        """Change a member's role (an organization keeps one owner) or Sandbox right, or
        deactivate them (or let them in again)."""
        organization = selectors.get_organization_by_slug(slug)
        membership = selectors.get_organization_member(organization, member_id)
        serializer = MemberUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = services.member_update(
            membership=membership, via="operator", **serializer.validated_data
        )
        return Response(OperatorMemberSerializer(membership).data)


class HealthView(OperatorView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request):
        """What /readyz checks, for automation that holds the operator token."""
        checks = health.readiness()
        ready = all(state == "ok" for state in checks.values())
        return Response(
            {"status": "ok" if ready else "unavailable", "checks": checks},
            status=200 if ready else 503,
        )


AUDIT_FILTERS = [
    OpenApiParameter("organization", OpenApiTypes.STR, description="An organization's slug."),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="Entries at or after."),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="Entries before."),
    OpenApiParameter("action", OpenApiTypes.STR, description="One action, e.g. member.changed."),
]


class AuditExportView(OperatorView):
    @extend_schema(parameters=AUDIT_FILTERS, responses={(200, "application/x-ndjson"): str})
    def get(self, request):
        """The audit log as JSON lines, oldest first, streamed."""
        organization = request.query_params.get("organization")
        entries = audit.audit_entries_filtered(
            organization=selectors.get_organization_by_slug(organization) if organization else None,
            since=request.query_params.get("since"),
            until=request.query_params.get("until"),
            action=request.query_params.get("action"),
        )
        return StreamedResponse(
            audit.audit_entries_as_json_lines(entries), content_type="application/x-ndjson"
        )
