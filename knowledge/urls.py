from django.urls import path

from knowledge import views

urlpatterns = [
    path("", views.knowledge_search, name="knowledge-search"),
    path("upload/", views.knowledge_upload, name="knowledge-upload"),
]
