import logging
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from django.shortcuts import render

from quor.lib import logs
from quor.lib.errors import error_response

logger = logging.getLogger(__name__)

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
        actor_token = logs.actor.set(None)
        started = time.monotonic()
        try:
            response = self.get_response(request)
            response["X-Request-ID"] = request.request_id
            logs.log_access(request.method, request.path, response.status_code, started)
            return response
        finally:
            logs.actor.reset(actor_token)
            logs.request_id.reset(token)


class ApiNotFoundMiddleware:
    """An /api/ URL that no route matches, not even the API's catch-all (which does not
    match a line break), is a 404 in the API's format too, not Django's page."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.status_code == 404
            and request.path.startswith("/api/")
            and response.get("Content-Type", "").startswith("text/html")
        ):
            return error_response(404, "not_found", f"No API endpoint at {request.path}.")
        return response


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
            if not request.path.startswith("/api/"):  # a page's form: a page that says so
                context = {"limit": limit, "length": length}
                return render(request, "413.html", context, status=413)
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


class ContentSecurityPolicyMiddleware:
    """Quor's pages run only their own scripts and styles: no inline script, no style
    attribute, no image or connection elsewhere, so Markdown from a model (sanitized
    already) cannot run code or send data out even if the sanitizer missed something.
    Web app previews are framed from their own hosts. A response that set its own policy
    (files, web app pages) keeps it; the API docs (Swagger UI's inline script) get none,
    and the admin may use inline styles (never scripts)."""

    EXEMPT_PREFIXES = ("/api/docs/",)
    # Django's admin writes a few <style> blocks of its own (the change lists).
    INLINE_STYLE_PREFIXES = ("/admin/",)

    def __init__(self, get_response):
        self.get_response = get_response
        base = urlsplit(settings.QUOR_WEBAPP_BASE_URL)
        port = f":{base.port}" if base.port else ""
        webapps = f"{base.scheme or 'http'}://*.{(base.hostname or 'localhost').lower()}{port}"
        self.policy = (
            "default-src 'self'; script-src 'self'; style-src 'self'; "
            "img-src 'self' data: blob:; font-src 'self'; connect-src 'self'{sockets}; "
            f"frame-src 'self' {webapps}; object-src 'none'; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'"
        )

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.get("Content-Type", "").startswith("text/html")
            and "Content-Security-Policy" not in response
            and not request.path.startswith(self.EXEMPT_PREFIXES)
        ):
            policy = self.policy.replace("{sockets}", self._websockets(request))
            if request.path.startswith(self.INLINE_STYLE_PREFIXES):
                policy = policy.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
            response["Content-Security-Policy"] = policy
        return response

    @staticmethod
    def _websockets(request) -> str:
        """The session page's WebSocket, named: Safari before 16 does not count ws: and
        wss: on the page's own host as 'self'."""
        try:
            host = request.get_host()
        except DisallowedHost:
            return ""
        return f" ws://{host} wss://{host}"
