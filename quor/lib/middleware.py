import logging
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse

from quor.lib import logs
from quor.lib.errors import error_response

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("quor.access")

UPLOAD_CONTENT_TYPES = ("application/octet-stream", "multipart/form-data")


class RequestIdMiddleware:
    """Gives every request an id, the caller's X-Request-ID when it is a safe token or a
    new one, returned in the response's X-Request-ID and carried by every log line
    written for the request (JSON logs); then logs the request, without its query."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.request_id = logs.request_id_from(request.headers.get("X-Request-ID"))
        token = logs.request_id.set(request.request_id)
        started = time.monotonic()
        try:
            response = self.get_response(request)
            response["X-Request-ID"] = request.request_id
            access_logger.info(
                "%s %s %s %.0fms",
                request.method,
                request.path,
                response.status_code,
                (time.monotonic() - started) * 1000,
            )
            return response
        finally:
            logs.request_id.reset(token)


class RequestSizeLimitMiddleware:
    """Refuses bodies over the limit with 413 before anything reads them: uploads
    (QUOR_MAX_UPLOAD_BYTES) are streamed, everything else (QUOR_MAX_REQUEST_BYTES) is not."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return error_response(400, "malformed_request", "Content-Length is not a number.")
        limit = (
            settings.QUOR_MAX_UPLOAD_BYTES
            if request.content_type in UPLOAD_CONTENT_TYPES
            else settings.QUOR_MAX_REQUEST_BYTES
        )
        if length > limit:
            return error_response(
                413, "request_too_large", f"The request body is larger than {limit} bytes."
            )
        return self.get_response(request)


class DatabaseUnavailableMiddleware:
    """PostgreSQL cannot be reached: a 503 that says so (JSON for the API) instead of a
    bare 500. Nothing else to do: the broken connection is dropped at the end of the
    request and the next one connects again."""

    MESSAGE = "Quor's database cannot be reached right now; try again in a moment."

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("database unavailable for %s: %s", request.path, exception)
        if request.path.startswith("/api/"):
            return error_response(503, "service.database_unavailable", self.MESSAGE)
        return HttpResponse(self.MESSAGE, status=503, content_type="text/plain; charset=utf-8")
