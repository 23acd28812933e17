from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import services
from approvals.api.serializers import ApprovalSerializer, DecisionSerializer
from quor.lib.errors import NotFound
from quor.lib.pagination import NEWEST_FIRST, CursorPagination
from quor.lib.permissions import Permission
from quor.models import ServiceAccount
from sandboxes.runtime import services as sandbox_services
from sandboxes.selectors import is_uuid

STATUS = OpenApiParameter("status", OpenApiTypes.STR, OpenApiParameter.QUERY)


class SessionApprovalsView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.EVENTS
    pagination_class = CursorPagination

    @extend_schema(parameters=[STATUS], responses=ApprovalSerializer(many=True))
    def get(self, request, session_id):
        """The session's approval requests, newest first (paginated)."""
        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        session = sandbox_services.session_in_use(request.user, session_id)
        approvals = services.approvals_of_session(session, status=request.GET.get("status"))
        return pages.response(approvals, lambda page: [services.approval_payload(a) for a in page])


class ApprovalDecisionView(APIView):
    required_permission = Permission.SANDBOX_USE

    @extend_schema(request=DecisionSerializer, responses=ApprovalSerializer)
    def post(self, request, approval_id):
        """The session owner approves once, approves matching actions for the session,
        or rejects. Only pending, unexpired requests can be decided (409 otherwise)."""
        if not is_uuid(approval_id):
            raise NotFound("No such approval request.", code="approvals.not_found")
        services.get_approval_for_owner(request.user, approval_id)
        serializer = DecisionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        approval = services.decide_approval(
            user=request.user,
            approval_id=approval_id,
            decision=serializer.validated_data["decision"],
        )
        return Response(services.approval_payload(approval))
