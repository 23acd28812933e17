"""The OpenAPI schema's error responses: every operation lists the errors it can answer,
each with the one error body of quor/lib/errors.py (`Error`), so that a generated client
knows every answer (README, "API"; tests/quor/test_api_schema_conformance.py checks it).

A drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]): the
statuses follow from what the operation takes and how it is authenticated; `EXTRA_ERRORS`
adds those that depend on the operation's own checks.

`AutoSchema` (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]) documents what the serializers
enforce that drf-spectacular leaves out: a text field that may not be blank needs a
character other than whitespace (DRF trims it, then refuses the empty string), and a
`StrictSerializer` refuses fields it does not know.
"""

from drf_spectacular import openapi
from drf_spectacular.drainage import has_override
from rest_framework import serializers

from quor.lib.serializers import StrictSerializer


class AutoSchema(openapi.AutoSchema):
    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False  # unknown fields are refused
            if getattr(serializer, "requires_a_field", False):
                schema["minProperties"] = 1
        return schema

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        if body and getattr(self.get_request_serializer(), "requires_a_field", False):
            body["required"] = True  # an empty PATCH is refused: it must send a field
        return body

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if (
            direction == "request"
            and isinstance(field, serializers.ListField)
            and not field.allow_empty
            and schema.get("type") == "array"
        ):
            schema.setdefault("minItems", 1)
        return schema

    def _get_serializer_field_meta(self, field, direction):
        meta = super()._get_serializer_field_meta(field, direction)
        if (
            direction == "request"
            and not has_override(field, "field")  # the field's own schema says it all
            and isinstance(field, serializers.CharField)
            and not field.allow_blank
            and not field.read_only
            and not isinstance(field, serializers.ChoiceField)
        ):
            meta["minLength"] = 1
        if (
            direction == "request"
            and not has_override(field, "field")
            and isinstance(field, serializers.CharField)
            and not field.read_only
            and not isinstance(field, FORMATTED_TEXT)
            and not any(hasattr(validator, "regex") for validator in field.validators)
        ):
            # DRF refuses a NUL character in any text; non-blank text is not only spaces.
            non_blank = not field.allow_blank and field.trim_whitespace
            meta["pattern"] = r"^[^\x00]*\S[^\x00]*$" if non_blank else r"^[^\x00]*$"
        return meta


FORMATTED_TEXT = (
    serializers.ChoiceField,
    serializers.EmailField,
    serializers.URLField,
    serializers.UUIDField,
    serializers.IPAddressField,
)
"""Text whose format the schema states already."""

ERROR_COMPONENT = "Error"

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every API error (docs/errors.md lists the codes).",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Stable; what clients react to (docs/errors.md).",
                },
                "message": {"type": "string", "description": "For people; may change."},
                "fields": {
                    "type": "object",
                    "description": "On validation errors: each bad field and its problems.",
                    "additionalProperties": True,
                },
            },
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}

DESCRIPTIONS = {
    "400": "The request is not valid (the code says why; `fields` on validation errors).",
    "401": "No credentials, or the token is unknown, expired or revoked.",
    "403": "Not allowed: the role, the organization, Sandbox access or the token's scope.",
    "404": "No such object for this user (another user's objects are 404 too).",
    "409": "The request conflicts with the object's current state.",
    "411": "The upload has no Content-Length.",
    "413": "The body is too large.",
    "415": "The body's content type is not accepted.",
    "422": "The `Idempotency-Key` was used before for another request.",
    "429": "Too many requests (`Retry-After` says when to retry), or an organization limit.",
    "503": "A service Quor depends on is unavailable; nothing was changed: retry.",
}

HEADERS = {
    "401": {
        "WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer`."},
    },
    "429": {
        "Retry-After": {
            "schema": {"type": "string"},
            "description": "Whole seconds until one more request is accepted (rate limits).",
        },
    },
}

WRITES = {"post", "put", "patch", "delete"}

# Errors that depend on the operation's own checks: (METHOD, path) -> statuses.
EXTRA_ERRORS: dict[tuple[str, str], set[str]] = {
    ("GET", "/api/v1/sandbox/"): {"503"},
    ("POST", "/api/v1/sandbox/"): {"503"},
    ("POST", "/api/v1/sandbox/start-empty/"): {"503"},
    ("DELETE", "/api/v1/library/"): {"404"},
    ("GET", "/api/v1/sessions/{session_id}/files/archive"): {"413", "503"},
    ("GET", "/api/v1/sessions/{session_id}/files/content"): {"503"},
    ("GET", "/api/v1/sessions/{session_id}/files/"): {"503"},
    ("POST", "/api/v1/sessions/{session_id}/files/content"): {"411", "503"},
    ("POST", "/api/v1/sessions/{session_id}/exec/"): {"422", "503"},
    ("POST", "/api/v1/sessions/"): {"503"},
    ("POST", "/api/v1/sessions/{id}/messages/"): {"503"},
}


def _error_statuses(path: str, method: str, operation: dict) -> set[str]:
    parameters = operation.get("parameters", [])
    security = {name for requirement in operation.get("security", []) for name in requirement}
    statuses = set(EXTRA_ERRORS.get((method.upper(), path), ()))
    if security and {} not in operation.get("security", []):
        statuses |= {"401", "403"}
    if "personalApiToken" in security:
        statuses.add("429")  # the API rate limit (quor/lib/throttling.py)
    if operation.get("requestBody") or any(p["in"] == "query" for p in parameters):
        statuses.add("400")
    if operation.get("requestBody"):
        statuses |= {"413", "415"}
    if any(p["in"] == "path" for p in parameters):
        statuses.add("404")
    if method in WRITES:
        statuses.add("409")
    return statuses


def add_error_responses(result, generator, request, public):
    """Adds the shared `Error` component and each operation's error responses."""
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR_COMPONENT] = ERROR_SCHEMA
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "page_size" and parameter["in"] == "query":
                    parameter["schema"] = {"type": "integer", "minimum": 1}
            responses = operation.setdefault("responses", {})
            for status in sorted(_error_statuses(path, method, operation)):
                if status in responses:
                    continue
                response = {
                    "description": DESCRIPTIONS[status],
                    "content": {"application/json": {"schema": ref}},
                }
                if status in HEADERS:
                    response["headers"] = HEADERS[status]
                responses[status] = response
    return result
