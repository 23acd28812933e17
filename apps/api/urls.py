from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.api import views

router = SimpleRouter()
router.register("apps", views.AppViewSet, basename="api-app")

urlpatterns = [
    path("apps/catalog/", views.AppCatalogView.as_view(), name="api-app-catalog"),
    path(
        "apps/<int:app_id>/actions/<str:key>/",
        views.AppActionPolicyView.as_view(),
        name="api-app-action",
    ),
    path(
        "apps/<int:app_id>/credential/",
        views.AppCredentialView.as_view(),
        name="api-app-credential",
    ),
    *router.urls,
]
