from django.urls import path
from rest_framework.routers import SimpleRouter

from quor.api import views

router = SimpleRouter()
router.register("model-providers", views.ModelProviderViewSet, basename="model-provider")
router.register("tokens", views.ApiTokenViewSet, basename="api-token")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="api-me"),
    path("models/", views.ModelListView.as_view(), name="api-models"),
    *router.urls,
]
