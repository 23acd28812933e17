from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from quor import views
from quor.forms import EmailAuthenticationForm
from quor.lib.login_attempts import sign_in_rate_limited
from quor.lib.permissions import public_page

urlpatterns = [
    path("", include("sandboxes.urls")),
    path("", include("webapps.urls")),
    path("apps/", include("apps.urls")),
    path("knowledge/", include("knowledge.urls")),
    path(
        "accounts/login/",
        public_page(
            sign_in_rate_limited(
                auth_views.LoginView.as_view(authentication_form=EmailAuthenticationForm)
            )
        ),
        name="login",
    ),
    path("accounts/logout/", views.log_out, name="logout"),
    path("accounts/sso/", views.sso_start, name="sso-start"),
    path("accounts/sso/callback/", views.sso_callback, name="sso-callback"),
    path(
        "accounts/sso/back-channel-logout/",
        views.sso_back_channel_logout,
        name="sso-back-channel-logout",
    ),
    path("account/tokens/", views.api_tokens, name="api-tokens"),
    path("account/tokens/<int:token_id>/revoke", views.api_token_revoke, name="api-token-revoke"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/", include("quor.api.urls")),
    path("api/v1/", include("sandboxes.api.urls")),
    path("api/v1/", include("webapps.api.urls")),
    path("api/v1/", include("approvals.api.urls")),
    path("api/v1/", include("apps.api.urls")),
    path("api/v1/", include("knowledge.api.urls")),
    path("api/operator/v1/", include("quor.api.operator_urls")),
    path("scim/v2/", include("quor.api.scim_urls")),
    re_path(r"^api/(?P<unmatched>.*)$", views.api_not_found),
]

handler500 = "quor.views.server_error"
