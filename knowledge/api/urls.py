from django.urls import path

from knowledge.api import views

urlpatterns = [
    path("knowledge/search", views.SearchView.as_view(), name="api-knowledge-search"),
    path(
        "runtime/knowledge/search",
        views.RuntimeSearchView.as_view(),
        name="api-runtime-knowledge-search",
    ),
    path("knowledge/sources/", views.SourceListView.as_view(), name="api-knowledge-sources"),
    path(
        "knowledge/sources/<int:source_id>/",
        views.SourceView.as_view(),
        name="api-knowledge-source",
    ),
    path(
        "knowledge/sources/<int:source_id>/sync",
        views.SourceSyncView.as_view(),
        name="api-knowledge-source-sync",
    ),
    path(
        "knowledge/sources/<int:source_id>/documents/",
        views.SourceDocumentsView.as_view(),
        name="api-knowledge-source-documents",
    ),
    path(
        "knowledge/documents/<int:document_id>/",
        views.DocumentView.as_view(),
        name="api-knowledge-document",
    ),
    path(
        "knowledge/documents/<int:document_id>/access",
        views.DocumentAccessView.as_view(),
        name="api-knowledge-document-access",
    ),
]
