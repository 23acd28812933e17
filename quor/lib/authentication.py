from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from quor import services


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <personal API token>` for integrations."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        keyword, _, raw_token = header.partition(" ")
        if keyword != self.keyword:
            return None
        raw_token = raw_token.strip()
        if not raw_token:
            raise exceptions.AuthenticationFailed("The Authorization header has no token.")
        user = services.api_token_authenticate(raw_token=raw_token)
        if user is None:
            raise exceptions.AuthenticationFailed("The API token is unknown or revoked.")
        return (user, None)

    def authenticate_header(self, request):
        return self.keyword


class ApiTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    """Describes the bearer token in the OpenAPI schema."""

    target_class = ApiTokenAuthentication
    name = "personalApiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A personal API token."}
