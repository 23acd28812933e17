from django.urls import path

from sandboxes import views
from sandboxes.scheduling import views as scheduled_views

urlpatterns = [
    path("", views.session_list, name="home"),
    path("sessions/new", views.session_new, name="session-new"),
    path("sandbox/start-empty", views.sandbox_start_empty, name="sandbox-start-empty"),
    path("sessions/<str:session_id>/", views.session_detail, name="session-detail"),
    path("sessions/<str:session_id>/follow-up", views.session_follow_up, name="session-follow-up"),
    path("sessions/<str:session_id>/cancel", views.session_cancel, name="session-cancel"),
    path("sessions/<str:session_id>/rename", views.session_rename, name="session-rename"),
    path("sessions/<str:session_id>/delete", views.session_delete, name="session-delete"),
    path(
        "sessions/<str:session_id>/public-links",
        views.session_public_link_create,
        name="session-public-link-create",
    ),
    path(
        "sessions/<str:session_id>/public-links/<uuid:link_id>/revoke",
        views.session_public_link_revoke,
        name="session-public-link-revoke",
    ),
    path(
        "sessions/<str:session_id>/terminal/<str:recording_id>.cast",
        views.session_terminal_recording,
        name="session-terminal-recording",
    ),
    path(
        "terminal-recordings/<str:recording_id>.cast",
        views.terminal_recording_audit,
        name="terminal-recording-audit",
    ),
    path("scheduled/", scheduled_views.task_list, name="scheduled-list"),
    path("scheduled/new", scheduled_views.task_new, name="scheduled-new"),
    path("scheduled/<int:task_id>/", scheduled_views.task_detail, name="scheduled-detail"),
    path("scheduled/<int:task_id>/edit", scheduled_views.task_edit, name="scheduled-edit"),
    path("scheduled/<int:task_id>/enable", scheduled_views.task_enable, name="scheduled-enable"),
    path("scheduled/<int:task_id>/run", scheduled_views.task_run_now, name="scheduled-run"),
    path("scheduled/<int:task_id>/delete", scheduled_views.task_delete, name="scheduled-delete"),
]
