"""/scim/v2/: no trailing slashes, as SCIM clients write the paths (RFC 7644 §3.2)."""

from django.urls import path, re_path

from quor.api import scim

urlpatterns = [
    path(
        "ServiceProviderConfig",
        scim.ServiceProviderConfigView.as_view(),
        name="scim-service-provider-config",
    ),
    path("ResourceTypes", scim.ResourceTypeListView.as_view(), name="scim-resource-types"),
    path("ResourceTypes/<str:name>", scim.ResourceTypeView.as_view(), name="scim-resource-type"),
    path("Schemas", scim.SchemaListView.as_view(), name="scim-schemas"),
    path("Schemas/<str:schema_id>", scim.SchemaView.as_view(), name="scim-schema"),
    path(".search", scim.SearchView.as_view(), name="scim-search"),
    path("Users", scim.ResourceListView.as_view(kind="Users"), name="scim-users"),
    path("Users/.search", scim.SearchView.as_view(kind="Users"), name="scim-users-search"),
    path("Users/<str:resource_id>", scim.ResourceView.as_view(kind="Users"), name="scim-user"),
    path("Groups", scim.ResourceListView.as_view(kind="Groups"), name="scim-groups"),
    path("Groups/.search", scim.SearchView.as_view(kind="Groups"), name="scim-groups-search"),
    path("Groups/<str:resource_id>", scim.ResourceView.as_view(kind="Groups"), name="scim-group"),
    re_path(r"^.*$", scim.NotFoundView.as_view(), name="scim-not-found"),
]
