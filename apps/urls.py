from django.urls import path

from apps import views

urlpatterns = [
    path("", views.app_list, name="app-list"),
    path("<int:app_id>/credential", views.app_credential_set, name="app-credential-set"),
    path(
        "<int:app_id>/credential/delete",
        views.app_credential_clear,
        name="app-credential-clear",
    ),
]
