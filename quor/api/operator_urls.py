from django.urls import path

from quor.api import operator
from sandboxes.api import operator as sandboxes

urlpatterns = [
    path("organizations/", operator.OrganizationListView.as_view(), name="operator-organizations"),
    path(
        "organizations/<slug:slug>/",
        operator.OrganizationView.as_view(),
        name="operator-organization",
    ),
    path(
        "organizations/<slug:slug>/members/",
        operator.MemberListView.as_view(),
        name="operator-members",
    ),
    path(
        "organizations/<slug:slug>/members/<int:member_id>/",
        operator.MemberView.as_view(),
        name="operator-member",
    ),
    path("sandboxes/", sandboxes.OperatorSandboxListView.as_view(), name="operator-sandboxes"),
    path(
        "sandboxes/reconcile/",
        sandboxes.OperatorReconcileView.as_view(),
        name="operator-sandboxes-reconcile",
    ),
    path(
        "sandboxes/<str:sandbox_id>/",
        sandboxes.OperatorSandboxView.as_view(),
        name="operator-sandbox",
    ),
    path(
        "sandboxes/<str:sandbox_id>/stop/",
        sandboxes.OperatorSandboxStopView.as_view(),
        name="operator-sandbox-stop",
    ),
    path(
        "sandboxes/<str:sandbox_id>/destroy/",
        sandboxes.OperatorSandboxDestroyView.as_view(),
        name="operator-sandbox-destroy",
    ),
    path("health/", operator.HealthView.as_view(), name="operator-health"),
    path("audit/", operator.AuditExportView.as_view(), name="operator-audit"),
]
