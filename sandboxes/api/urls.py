from django.urls import path
from rest_framework.routers import SimpleRouter

from sandboxes.api import scheduled, views

router = SimpleRouter()
router.register("sessions", views.SessionViewSet, basename="api-session")
router.register("scheduled-tasks", scheduled.ScheduledTaskViewSet, basename="api-scheduled-task")

urlpatterns = [
    path("sandbox/", views.MySandboxView.as_view(), name="api-my-sandbox"),
    path("sandbox/start-empty/", views.StartEmptyView.as_view(), name="api-sandbox-start-empty"),
    path("library/", views.LibraryView.as_view(), name="api-library"),
    path("runtime/whoami/", views.RuntimeWhoAmIView.as_view(), name="api-runtime-whoami"),
    path(
        "runtime/sessions/<str:session_id>/events/",
        views.RuntimeSessionEventsView.as_view(),
        name="api-runtime-session-events",
    ),
    path(
        "runtime/sessions/<str:session_id>/heartbeat/",
        views.RuntimeSessionHeartbeatView.as_view(),
        name="api-runtime-session-heartbeat",
    ),
    path(
        "runtime/sessions/<str:session_id>/webapps/",
        views.RuntimeSessionWebAppsView.as_view(),
        name="api-runtime-session-webapps",
    ),
    path(
        "sessions/<str:session_id>/exec/", views.SessionExecView.as_view(), name="api-session-exec"
    ),
    path(
        "sessions/<str:session_id>/execs/",
        views.SessionExecRecordViewSet.as_view({"get": "list"}),
        name="api-session-execs",
    ),
    path(
        "sessions/<str:session_id>/execs/<str:exec_id>/",
        views.SessionExecRecordViewSet.as_view({"get": "retrieve"}),
        name="api-session-exec-record",
    ),
    path(
        "sessions/<str:session_id>/files/",
        views.SessionFilesView.as_view(),
        name="api-session-files",
    ),
    path(
        "sessions/<str:session_id>/files/content",
        views.SessionFileContentView.as_view(),
        name="api-session-file-content",
    ),
    path(
        "sessions/<str:session_id>/files/archive",
        views.SessionFileArchiveView.as_view(),
        name="api-session-files-archive",
    ),
    *router.urls,
]
