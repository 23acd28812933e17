"""The scheduled tasks API: the owner's tasks, their runs, and running one now. Another
user's task is 404, like any object that is not one's own."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from quor.lib.pagination import CursorPagination
from quor.lib.permissions import Permission
from quor.lib.serializers import StrictSerializer
from quor.selectors import make_model_id
from sandboxes.models import ScheduledRun, ScheduledTask
from sandboxes.scheduling import services as scheduled

TASK_ID = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)


class ScheduledRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = ScheduledRun
        fields = ["id", "scheduled_for", "status", "reason", "session", "created_at", "finished_at"]
        read_only_fields = fields


class ScheduledTaskSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField()
    apps = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    preapproved_apps = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    last_run = serializers.SerializerMethodField()

    class Meta:
        model = ScheduledTask
        fields = [
            "id",
            "name",
            "prompt",
            "cron",
            "timezone",
            "model",
            "skills",
            "apps",
            "preapproved_apps",
            "enabled",
            "next_run_at",
            "last_run",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_model(self, task) -> str:
        return make_model_id(task.model_provider_id, task.model_name)

    @extend_schema_field(ScheduledRunSerializer(allow_null=True))
    def get_last_run(self, task):
        run = scheduled.last_run_of(task)
        return ScheduledRunSerializer(run).data if run else None


def _app_ids(help_text: str):
    return serializers.ListField(
        child=serializers.IntegerField(), required=False, max_length=100, help_text=help_text
    )


class ScheduledTaskWriteSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200)
    prompt = serializers.CharField(trim_whitespace=False)
    cron = serializers.CharField(
        max_length=100, help_text="Five fields: minute hour day-of-month month day-of-week."
    )
    timezone = serializers.CharField(
        max_length=64, required=False, help_text="An IANA time zone name; UTC if not given."
    )
    model = serializers.CharField(help_text="An id from /api/v1/models/.")
    skills = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        max_length=50,
        help_text="Names of the organization's Skills to use.",
    )
    apps = _app_ids("Ids of the organization's Apps each run may use (from /api/v1/apps/).")
    preapproved_apps = _app_ids(
        "Apps (among `apps`) whose Ask actions go through during a run; Deny still applies."
    )
    enabled = serializers.BooleanField(required=False)


@extend_schema_view(
    retrieve=extend_schema(parameters=[TASK_ID]),
    destroy=extend_schema(parameters=[TASK_ID]),
)
class ScheduledTaskViewSet(viewsets.ViewSet):
    """The requesting user's scheduled tasks: prompts that run as new sessions on a
    cron schedule, with nobody present."""

    required_permission = Permission.SANDBOX_USE
    serializer_class = ScheduledTaskSerializer
    pagination_class = CursorPagination
    lookup_value_regex = r"\d+"

    def list(self, request):
        """The requesting user's scheduled tasks, oldest first (paginated)."""
        pages = CursorPagination(request, ordering=("id",))
        tasks = scheduled.scheduled_tasks_of(request.user)
        return pages.response(tasks, lambda page: ScheduledTaskSerializer(page, many=True).data)

    def retrieve(self, request, pk=None):
        task = scheduled.get_scheduled_task_for_user(request.user, pk)
        return Response(ScheduledTaskSerializer(task).data)

    @extend_schema(request=ScheduledTaskWriteSerializer, responses={201: ScheduledTaskSerializer})
    def create(self, request):
        serializer = ScheduledTaskWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = scheduled.scheduled_task_create(user=request.user, **serializer.validated_data)
        return Response(ScheduledTaskSerializer(task).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[TASK_ID],
        request=ScheduledTaskWriteSerializer,
        responses=ScheduledTaskSerializer,
    )
    def partial_update(self, request, pk=None):
        """Changes the given fields; a new schedule or re-enabling counts from now."""
        task = scheduled.get_scheduled_task_for_user(request.user, pk)
        serializer = ScheduledTaskWriteSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        task = scheduled.scheduled_task_update(
            user=request.user, task=task, **serializer.validated_data
        )
        return Response(ScheduledTaskSerializer(task).data)

    def destroy(self, request, pk=None):
        task = scheduled.get_scheduled_task_for_user(request.user, pk)
        scheduled.scheduled_task_delete(user=request.user, task=task)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(parameters=[TASK_ID], responses=ScheduledRunSerializer(many=True))
    @action(detail=True, methods=["get"])
    def runs(self, request, pk=None):
        """The task's runs, newest first (paginated)."""
        pages = CursorPagination(request, ordering=("-scheduled_for", "-id"))
        task = scheduled.get_scheduled_task_for_user(request.user, pk)
        return pages.response(
            scheduled.all_runs_of(task), lambda page: ScheduledRunSerializer(page, many=True).data
        )

    @extend_schema(parameters=[TASK_ID], request=None, responses={201: ScheduledRunSerializer})
    @action(detail=True, methods=["post"])
    def run(self, request, pk=None):
        """Runs the task now, as a new session; the schedule is unchanged."""
        task = scheduled.get_scheduled_task_for_user(request.user, pk)
        run = scheduled.run_now(user=request.user, task=task)
        return Response(ScheduledRunSerializer(run).data, status=status.HTTP_201_CREATED)
