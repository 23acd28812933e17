"""One exception hierarchy for domain errors, and the one error format of the API.

Every API error body is `{"error": {"code": ..., "message": ..., "fields": {...}}}`.
Codes are stable and listed in docs/errors.md.
"""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from quor.lib import metrics


class QuorError(Exception):
    status = 400
    code = "invalid_request"
    default_message = "The request is not valid."
    retry_after: int | None = None
    """Whole seconds to wait before retrying, sent as `Retry-After`; None: no header."""

    def __init__(
        self, message: str | None = None, *, code: str | None = None, fields=None, status=None
    ):
        self.message = message or self.default_message
        if code:
            self.code = code
        if status:
            self.status = status
        self.fields = fields
        super().__init__(self.message)


class InvalidInput(QuorError):
    status = 400
    code = "invalid_input"


class AccessDenied(QuorError):
    status = 403
    code = "access.denied"
    default_message = "You do not have access to this."


class NotFound(QuorError):
    status = 404
    code = "not_found"
    default_message = "Not found."


class Conflict(QuorError):
    status = 409
    code = "conflict"


class CorruptBlob(QuorError):
    """What the file store read differs from what it committed (size or sha256), or the
    object is gone: the data must not be used."""

    status = 500
    code = "filestore.corrupt_blob"
    default_message = "A stored file is missing or damaged."


class FileStoreMisconfigured(QuorError):
    """This process's file store is not the one the database's files were written to (a
    wrong directory or bucket): nothing it lacks is damaged, and nothing may be written."""

    status = 503
    code = "filestore.misconfigured"
    default_message = "The file store is not the one Quor's files are in."


class FileStoreUnavailable(QuorError):
    status = 503
    code = "filestore.unavailable"
    default_message = "The file store cannot be reached."


def error_body(code: str, message: str, fields=None) -> dict:
    """The body of every API error response, counted by code."""
    metrics.api_error(code)
    error = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    return {"error": error}


def error_response(status: int, code: str, message: str) -> JsonResponse:
    """The API error format for responses made outside DRF (middleware, URL fallbacks)."""
    return JsonResponse(error_body(code, message), status=status)


def csrf_failure(request, reason=""):
    """Django's CSRF refusal (CSRF_FAILURE_VIEW), in the API's format on the API. There
    only a URL that names no endpoint meets it (DRF checks CSRF itself, for browser
    sessions only): that URL's 404 comes first. Pages keep Django's page."""
    from django.urls import Resolver404, resolve
    from django.views.csrf import csrf_failure as django_csrf_failure

    if not request.path.startswith("/api/"):
        return django_csrf_failure(request, reason=reason)
    try:
        endpoint = resolve(request.path_info).func.__name__ != "api_not_found"
    except Resolver404:
        endpoint = False
    if not endpoint:
        return error_response(404, "not_found", f"No API endpoint at {request.path}.")
    return error_response(403, "access.denied", f"CSRF check failed: {reason}")


_DRF_CODES = {
    drf_exceptions.ParseError: "malformed_request",
    drf_exceptions.NotAuthenticated: "not_authenticated",
    drf_exceptions.AuthenticationFailed: "authentication_failed",
    drf_exceptions.PermissionDenied: "access.denied",
    drf_exceptions.NotFound: "not_found",
    drf_exceptions.MethodNotAllowed: "method_not_allowed",
    drf_exceptions.NotAcceptable: "not_acceptable",
    drf_exceptions.UnsupportedMediaType: "unsupported_media_type",
    drf_exceptions.Throttled: "throttled",
}


def _flatten(detail):
    if isinstance(detail, list):
        return [str(item) for item in detail]
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    return str(detail)


def api_exception_handler(exc, context):
    """DRF's exception handler: every error, ours or DRF's, in the one format."""
    if isinstance(exc, QuorError):
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        body = error_body(exc.code, exc.message, exc.fields)
        return Response(body, status=exc.status, headers=headers)
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf_exceptions.PermissionDenied()
    if not isinstance(exc, drf_exceptions.APIException):
        return None
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if isinstance(exc, drf_exceptions.Throttled) and exc.wait is not None:
        headers["Retry-After"] = str(exc.wait)  # whole seconds (Throttled rounds up)
    if isinstance(exc, drf_exceptions.ValidationError):
        fields = _flatten(exc.detail)
        if isinstance(fields, list):
            fields = {"non_field_errors": fields}
        body = error_body("invalid_input", "Some fields are not valid.", fields)
    else:
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "error")
        body = error_body(code, str(exc.detail))
    return Response(body, status=exc.status_code, headers=headers)
