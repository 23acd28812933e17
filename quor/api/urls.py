from django.urls import path
from rest_framework.routers import SimpleRouter

from quor.api import views

router = SimpleRouter()
router.register("model-providers", views.ModelProviderViewSet, basename="model-provider")
router.register("tokens", views.ApiTokenViewSet, basename="api-token")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="api-me"),
    path("models/", views.ModelListView.as_view(), name="api-models"),
    path("members/", views.MemberListView.as_view(), name="api-members"),
    path("groups/", views.GroupListView.as_view(), name="api-groups"),
    path("service-accounts/", views.ServiceAccountListView.as_view(), name="api-service-accounts"),
    path(
        "service-accounts/<int:account_id>/",
        views.ServiceAccountView.as_view(),
        name="api-service-account",
    ),
    path(
        "service-accounts/<int:account_id>/tokens/",
        views.ServiceAccountTokenListView.as_view(),
        name="api-service-account-tokens",
    ),
    path(
        "service-accounts/<int:account_id>/tokens/<int:token_id>/",
        views.ServiceAccountTokenView.as_view(),
        name="api-service-account-token",
    ),
    *router.urls,
]
