from django.urls import path

from sandboxes import views

urlpatterns = [
    path("", views.session_list, name="home"),
    path("sessions/new", views.session_new, name="session-new"),
    path("sessions/<str:session_id>/", views.session_detail, name="session-detail"),
    path("sessions/<str:session_id>/follow-up", views.session_follow_up, name="session-follow-up"),
    path("sessions/<str:session_id>/cancel", views.session_cancel, name="session-cancel"),
]
