"""The operator API's sandboxes: every organization's, their state, and stop, destroy
and reconcile, done by tasks (202)."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from quor.api.operator import OperatorView
from quor.lib.pagination import CursorPagination
from quor.lib.serializers import StrictSerializer
from quor.lib.tasks import send_on_commit
from sandboxes import selectors
from sandboxes.models import Sandbox
from sandboxes.runtime import services


class OperatorSandboxSerializer(serializers.ModelSerializer):
    owner = serializers.EmailField(source="user.email", read_only=True)
    organization = serializers.SlugField(source="user.membership.organization.slug", default=None)

    class Meta:
        model = Sandbox
        fields = [
            "id", "owner", "organization", "backend", "state", "failure_reason",
            "network_policy", "image_ref", "has_workspace", "last_activity_at",
        ]  # fmt: skip
        read_only_fields = fields


class DestroySerializer(StrictSerializer):
    keep_workspace = serializers.BooleanField(default=False)


class OperatorSandboxListView(OperatorView):
    pagination_class = CursorPagination

    @extend_schema(
        parameters=[
            OpenApiParameter("organization", OpenApiTypes.STR, description="A slug."),
            OpenApiParameter("state", OpenApiTypes.STR, enum=Sandbox.State.values),
        ],
        responses=OperatorSandboxSerializer(many=True),
    )
    def get(self, request):
        """Every organization's sandboxes (paginated)."""
        sandboxes = selectors.sandboxes_for_operator(
            organization=request.query_params.get("organization", ""),
            state=request.query_params.get("state", ""),
        )
        pages = CursorPagination(request, ordering=("id",))
        return pages.response(
            sandboxes, lambda page: OperatorSandboxSerializer(page, many=True).data
        )


class OperatorSandboxView(OperatorView):
    @extend_schema(responses=OperatorSandboxSerializer)
    def get(self, request, sandbox_id):
        return Response(
            OperatorSandboxSerializer(selectors.get_sandbox_for_operator(sandbox_id)).data
        )


class OperatorSandboxStopView(OperatorView):
    @extend_schema(request=None, responses={202: OperatorSandboxSerializer})
    def post(self, request, sandbox_id):
        """Stops the runtime; the workspace stays."""
        sandbox = selectors.get_sandbox_for_operator(sandbox_id)
        services.sandbox_request_removal(sandbox=sandbox, destroy=False)
        return Response(OperatorSandboxSerializer(sandbox).data, status=status.HTTP_202_ACCEPTED)


class OperatorSandboxDestroyView(OperatorView):
    @extend_schema(request=DestroySerializer, responses={202: OperatorSandboxSerializer})
    def post(self, request, sandbox_id):
        """Removes the runtime and (unless keep_workspace) the workspace and snapshots."""
        sandbox = selectors.get_sandbox_for_operator(sandbox_id)
        serializer = DestroySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.sandbox_request_removal(
            sandbox=sandbox,
            destroy=True,
            keep_workspace=serializer.validated_data["keep_workspace"],
        )
        return Response(OperatorSandboxSerializer(sandbox).data, status=status.HTTP_202_ACCEPTED)


class OperatorReconcileView(OperatorView):
    @extend_schema(request=None, responses={202: None})
    def post(self, request):
        """Compares the runtimes with the database and repairs what differs (a task)."""
        send_on_commit("sandboxes.tasks.reconcile_sandboxes")
        return Response(status=status.HTTP_202_ACCEPTED)
