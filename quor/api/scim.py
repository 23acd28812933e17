"""The SCIM 2.0 endpoints (/scim/v2/): thin, each parses the request, calls quor.scim
and answers in SCIM's media type and error shape. They are not in the OpenAPI schema:
SCIM describes itself (/ServiceProviderConfig, /ResourceTypes, /Schemas)."""

from django.db import IntegrityError
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from quor.lib.authentication import ServiceAccountTokenAuthentication
from quor.lib.errors import QuorError
from quor.lib.permissions import SCIM_CLIENT
from quor.models import ServiceAccount

SCIM_CONTENT_TYPE = "application/scim+json"


def scim():
    """quor.scim, imported by the first SCIM request of a process: its payload models
    (scim2-models) take about 0.8 s of CPU to import, which every web, worker and command
    process paid at its start (they all load the URLs)."""
    from quor import scim as service

    return service


class ScimRenderer(JSONRenderer):
    media_type = SCIM_CONTENT_TYPE


class ScimParser(JSONParser):
    media_type = SCIM_CONTENT_TYPE


class ScimTokenAuthentication(ServiceAccountTokenAuthentication):
    """A service account's token that holds the scim scope, and nothing else."""

    def authenticate(self, request):
        found = super().authenticate(request)
        if found is not None and ServiceAccount.Scope.SCIM not in found[1].service_account.scopes:
            raise exceptions.AuthenticationFailed(
                "This service account's token does not have the scim scope."
            )
        return found


@extend_schema(exclude=True)
class ScimView(APIView):
    authentication_classes = [ScimTokenAuthentication]
    required_permission = SCIM_CLIENT
    parser_classes = [ScimParser, JSONParser]
    renderer_classes = [ScimRenderer, JSONRenderer]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self.organization = request.auth.service_account.organization
        self.base_url = request.build_absolute_uri("/scim/v2")

    def handle_exception(self, exc):
        """Every refusal in SCIM's error shape (RFC 7644 §3.12)."""
        if isinstance(exc, scim().ScimError):
            return Response(exc.payload(), status=exc.status)
        if isinstance(exc, IntegrityError):  # a concurrent request took the name first
            error = scim().ScimError(409, "A resource with this name exists.", "uniqueness")
            return Response(error.payload(), status=409)
        if isinstance(exc, QuorError):  # a service's refusal (e.g. members.exists)
            scim_type = "uniqueness" if exc.status == 409 else None
            error = scim().ScimError(exc.status, exc.message, scim_type)
            return Response(error.payload(), status=exc.status)
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            response = Response(scim().ScimError(401, str(exc.detail)).payload(), status=401)
            response["WWW-Authenticate"] = "Bearer"
            return response
        if isinstance(exc, exceptions.APIException):
            scim_type = "invalidSyntax" if isinstance(exc, exceptions.ParseError) else None
            error = scim().ScimError(exc.status_code, str(exc.detail), scim_type)
            response = Response(error.payload(), status=exc.status_code)
            if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
                response["Retry-After"] = str(exc.wait)
            return response
        return super().handle_exception(exc)

    def query(self) -> dict:
        return self.request.query_params.dict()


class ServiceProviderConfigView(ScimView):
    def get(self, request):
        return Response(scim().service_provider_config(self.base_url))


class ResourceTypeListView(ScimView):
    def get(self, request):
        return Response(scim().listed(scim().resource_types(self.base_url)))


class ResourceTypeView(ScimView):
    def get(self, request, name):
        return Response(_one(scim().resource_types(self.base_url), name, "resource type"))


class SchemaListView(ScimView):
    def get(self, request):
        return Response(scim().listed(scim().schemas(self.base_url)))


class SchemaView(ScimView):
    def get(self, request, schema_id):
        return Response(_one(scim().schemas(self.base_url), schema_id, "schema"))


def _one(documents: list[dict], document_id: str, what: str) -> dict:
    for document in documents:
        if document["id"] == document_id:
            return document
    raise scim().ScimError(404, f"No {what} {document_id}.")


class SearchView(ScimView):
    """POST .search at the root (users and groups) or under a resource type."""

    kind = ""

    def post(self, request):
        body = request.data if isinstance(request.data, dict) else {}
        return Response(scim().search(self.organization, self.kind, body, self.base_url))


class ResourceListView(ScimView):
    kind = ""

    def get(self, request):
        return Response(scim().search(self.organization, self.kind, self.query(), self.base_url))

    def post(self, request):
        resource = (
            scim()
            .RESOURCE_KINDS[self.kind]
            .create(self.organization, request.data, request.user, self.base_url)
        )
        response = Response(scim().resource_response(resource, {}), status=201)
        response["Location"] = resource.meta.location
        return response


class ResourceView(ScimView):
    kind = ""

    def get(self, request, resource_id):
        resource = (
            scim().RESOURCE_KINDS[self.kind].get(self.organization, resource_id, self.base_url)
        )
        return Response(scim().resource_response(resource, self.query()))

    def put(self, request, resource_id):
        return self._write(scim().RESOURCE_KINDS[self.kind].replace, resource_id)

    def patch(self, request, resource_id):
        return self._write(scim().RESOURCE_KINDS[self.kind].patch, resource_id)

    def _write(self, change, resource_id) -> Response:
        resource = change(
            self.organization, resource_id, self.request.data, self.request.user, self.base_url
        )
        return Response(scim().resource_response(resource, {}))

    def delete(self, request, resource_id):
        scim().RESOURCE_KINDS[self.kind].delete(self.organization, resource_id, request.user)
        return Response(status=204)


class NotFoundView(ScimView):
    """Any other path under /scim/v2/, in SCIM's error shape."""

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        raise scim().ScimError(404, f"No SCIM endpoint {request.path}.")
