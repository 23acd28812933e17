from django.urls import path

from webapps import views

urlpatterns = [
    path("webapps/<str:label>/", views.view_webapp, name="webapp-view"),
    path("webapps/<str:label>/open", views.open_webapp, name="webapp-open"),
]
