from django.conf import settings

from quor.lib.errors import error_response

UPLOAD_CONTENT_TYPES = ("application/octet-stream", "multipart/form-data")


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
