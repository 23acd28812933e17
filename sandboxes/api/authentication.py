from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from sandboxes.models import Sandbox, hash_token


class SandboxCredentialAuthentication(authentication.BaseAuthentication):
    """The sandbox's scoped Quor credential, which only the egress proxy holds and
    injects. Accepted on the sandbox-facing endpoints only; request.auth is the sandbox."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        keyword, _, credential = header.partition(" ")
        if keyword != "Bearer" or not credential.strip():
            return None
        sandbox = (
            Sandbox.objects.select_related("user")
            .filter(runtime_credential_hash=hash_token(credential.strip()))
            .exclude(runtime_credential_hash="")
            .first()
        )
        if sandbox is None or not sandbox.user.is_active:
            raise exceptions.AuthenticationFailed("The sandbox credential is unknown or revoked.")
        return (sandbox.user, sandbox)

    def authenticate_header(self, request):
        return "Bearer"


class SandboxCredentialScheme(OpenApiAuthenticationExtension):
    """Describes the sandbox credential in the OpenAPI schema."""

    target_class = SandboxCredentialAuthentication
    name = "sandboxCredential"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The sandbox's Quor credential, injected by the egress proxy.",
        }
