from django.urls import path

from webapps import views

urlpatterns = [
    path("webapps/<str:label>/open", views.open_webapp, name="webapp-open"),
]
