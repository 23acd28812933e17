import hmac
from datetime import datetime

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from quor import service_accounts, services
from quor.lib.permissions import declared_scope


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
        if raw_token.startswith(service_accounts.TOKEN_PREFIX):
            return None  # ServiceAccountTokenAuthentication's
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


class Operator:
    """Whom the operator token speaks for: the deployment's automation, not a user."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    is_operator = True
    pk = None
    email = "operator"
    membership = None

    def __str__(self):
        return self.email


OPERATOR = Operator()


def previous_operator_token_until() -> datetime:
    """When the previous operator token stops being accepted (ValueError if unset or
    not an ISO 8601 time with its offset)."""
    value = settings.QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL
    try:
        until = datetime.fromisoformat(value)
    except ValueError:
        until = None
    if until is None or until.tzinfo is None:
        raise ValueError(
            "QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL must be an ISO 8601 time with its offset "
            f"(e.g. 2026-12-31T12:00:00+00:00), not {value!r}."
        )
    return until


def operator_token_matches(raw_token: str) -> bool:
    """The current token, or the previous one until its time; both compared in constant
    time, whichever matches."""
    given = raw_token.encode()
    current = settings.QUOR_OPERATOR_TOKEN.encode()
    previous = settings.QUOR_OPERATOR_TOKEN_PREVIOUS.encode()
    matches_current = bool(current) & hmac.compare_digest(given, current)
    matches_previous = bool(previous) & hmac.compare_digest(given, previous)
    if matches_previous and not matches_current:
        try:
            matches_previous = timezone.now() < previous_operator_token_until()
        except ValueError:
            matches_previous = False
    return matches_current or matches_previous


class OperatorTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <operator token>`, on the operator API only."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        keyword, _, raw_token = header.partition(" ")
        if keyword != "Bearer" or not raw_token.strip():
            return None
        if not operator_token_matches(raw_token.strip()):
            raise exceptions.AuthenticationFailed("The operator token is unknown or expired.")
        return (OPERATOR, None)

    def authenticate_header(self, request):
        return "Bearer"


class OperatorTokenScheme(OpenApiAuthenticationExtension):
    target_class = OperatorTokenAuthentication
    name = "operatorToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The deployment's operator token (QUOR_OPERATOR_TOKEN).",
        }


class ServiceAccountTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer quor_sat_...`: a service account's token. request.auth is
    the token, whose scopes DeclaredPermission checks against the view's."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        keyword, _, raw_token = header.partition(" ")
        raw_token = raw_token.strip()
        if keyword != "Bearer" or not raw_token.startswith(service_accounts.TOKEN_PREFIX):
            return None
        token = service_accounts.service_account_authenticate(raw_token)
        if token is None:
            raise exceptions.AuthenticationFailed(
                "The service account token is unknown, expired or revoked."
            )
        return (token.service_account.user, token)

    def authenticate_header(self, request):
        return "Bearer"


class ServiceAccountTokenScheme(OpenApiAuthenticationExtension):
    """Lists, for each operation, the scope a service account's token needs (none:
    service accounts may not call it)."""

    target_class = ServiceAccountTokenAuthentication
    name = "serviceAccountToken"

    def get_security_requirement(self, auto_schema):
        action = getattr(auto_schema.view, "action", None) or auto_schema.method.lower()
        scope = declared_scope(auto_schema.view, action)
        return {self.name: [scope]} if scope else None

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A service account's token; each operation lists the scope it "
            "needs (sessions, exec, files, events; scim only on /scim/v2/).",
        }
