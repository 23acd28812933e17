from django.urls import path

from approvals.api import views

urlpatterns = [
    path(
        "sessions/<str:session_id>/approvals/",
        views.SessionApprovalsView.as_view(),
        name="api-session-approvals",
    ),
    path(
        "approvals/<str:approval_id>/decision/",
        views.ApprovalDecisionView.as_view(),
        name="api-approval-decision",
    ),
]
