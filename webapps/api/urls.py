from django.urls import path, re_path

from webapps.api import views

urlpatterns = [
    # Sub-resources of a session: the same pattern, names and operation ids as the
    # session routes of sandboxes/api/urls.py (its router), where they lived before.
    re_path(
        r"^sessions/(?P<pk>[^/.]+)/public-links/$",
        views.SessionPublicLinksView.as_view(),
        name="api-session-public-links",
    ),
    re_path(
        r"^sessions/(?P<pk>[^/.]+)/webapps/$",
        views.SessionWebAppsView.as_view(),
        name="api-session-webapps",
    ),
    path("tunnels/", views.TunnelListView.as_view(), name="api-tunnels"),
    path("tunnels/<uuid:tunnel_id>/", views.TunnelView.as_view(), name="api-tunnel"),
    path("public-links/<uuid:link_id>/", views.PublicLinkView.as_view(), name="api-public-link"),
    path(
        "public-links/<uuid:link_id>/visits/",
        views.PublicLinkVisitsView.as_view(),
        name="api-public-link-visits",
    ),
]
