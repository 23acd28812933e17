from django.urls import path
from rest_framework.routers import SimpleRouter

from sandboxes.api import views

router = SimpleRouter()
router.register("sessions", views.SessionViewSet, basename="session")

urlpatterns = [
    path("sandbox/", views.MySandboxView.as_view(), name="api-my-sandbox"),
    *router.urls,
]
