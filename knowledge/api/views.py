"""The knowledge API. Members search (and see the sources they can read from);
organization admins manage sources (and sync directory and S3 ones), documents and
access lists. A sandbox searches through its own endpoint under runtime/, as its owner,
with the credential the egress proxy injects. Each view: access check, service call,
response."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledge import selectors, services, sync
from knowledge.api.serializers import (
    AccessSerializer,
    DocumentSerializer,
    DocumentUploadSerializer,
    SearchRequestSerializer,
    SearchResponseSerializer,
    SourceAdminSerializer,
    SourceCreateSerializer,
    SourceSerializer,
)
from knowledge.models import KnowledgeDocument, KnowledgeSource
from knowledge.search import search_for_user, sources_readable_by
from quor.lib.errors import NotFound
from quor.lib.pagination import CursorPagination
from quor.lib.permissions import (
    SANDBOX_CREDENTIAL,
    Permission,
    check_sandbox_access,
    require_permission,
    role_has,
)
from sandboxes.api.authentication import SandboxCredentialAuthentication


def _search(request):
    serializer = SearchRequestSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    results = search_for_user(
        request.user,
        data["query"],
        source_ids=data.get("sources"),
        content_types=data.get("types"),
        limit=data["limit"],
    )
    return Response(SearchResponseSerializer({"results": results}).data)


class SearchView(APIView):
    """Passages of the documents you may read, best first. No count of anything else."""

    required_permission = Permission.KNOWLEDGE_SEARCH

    @extend_schema(request=SearchRequestSerializer, responses=SearchResponseSerializer)
    def post(self, request):
        return _search(request)


class RuntimeSearchView(APIView):
    """Sandbox-facing: the same search, as the sandbox's owner and nobody more."""

    authentication_classes = [SandboxCredentialAuthentication]
    required_permission = SANDBOX_CREDENTIAL

    @extend_schema(request=SearchRequestSerializer, responses=SearchResponseSerializer)
    def post(self, request):
        check_sandbox_access(request.user)  # a member whose Sandbox right was taken away
        return _search(request)


class SourceListView(APIView):
    """Admins: every source of the organization. Members: the sources they can read at
    least one document of (for the search's filter)."""

    required_permissions = {"get": Permission.ACCOUNT, "post": Permission.ORGANIZATION_MANAGE}
    pagination_class = CursorPagination

    @extend_schema(responses=SourceAdminSerializer(many=True))
    def get(self, request):
        pages = CursorPagination(request, ordering=("name", "id"))
        membership = require_permission(request.user, Permission.ACCOUNT)
        if role_has(membership.role, Permission.ORGANIZATION_VIEW):
            sources = selectors.sources_of(membership.organization)
            return pages.response(sources, lambda page: SourceAdminSerializer(page, many=True).data)
        return pages.response(
            sources_readable_by(request.user), lambda page: SourceSerializer(page, many=True).data
        )

    @extend_schema(request=SourceCreateSerializer, responses={201: SourceAdminSerializer})
    def post(self, request):
        membership = require_permission(request.user, Permission.ORGANIZATION_MANAGE)
        serializer = SourceCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        source = services.source_create(
            organization=membership.organization, **serializer.validated_data
        )
        return Response(SourceAdminSerializer(source).data, status=status.HTTP_201_CREATED)


def _organization_source(request, source_id, permission) -> KnowledgeSource:
    membership = require_permission(request.user, permission)
    source = selectors.source_of(membership.organization, source_id)
    if source is None:
        raise NotFound("No such source.")
    return source


def _organization_document(request, document_id, permission) -> KnowledgeDocument:
    membership = require_permission(request.user, permission)
    document = selectors.document_of(membership.organization, document_id)
    if document is None:
        raise NotFound("No such document.")
    return document


class SourceView(APIView):
    """Admins: a source with its sync state."""

    required_permission = Permission.ORGANIZATION_VIEW

    @extend_schema(responses=SourceAdminSerializer)
    def get(self, request, source_id):
        source = _organization_source(request, source_id, Permission.ORGANIZATION_VIEW)
        return Response(SourceAdminSerializer(source).data)


class SourceSyncView(APIView):
    """Admins: sync a directory or S3 source now. 202: the sync runs in a task, and the
    source's sync_state, sync_error and synced_at tell how it went."""

    required_permission = Permission.ORGANIZATION_MANAGE

    @extend_schema(request=None, responses={202: SourceAdminSerializer})
    def post(self, request, source_id):
        source = _organization_source(request, source_id, Permission.ORGANIZATION_MANAGE)
        sync.source_request_sync(source)
        return Response(SourceAdminSerializer(source).data, status=status.HTTP_202_ACCEPTED)


class SourceDocumentsView(APIView):
    """Admins: a source's documents (with access lists and errors), and uploads."""

    required_permissions = {
        "get": Permission.ORGANIZATION_VIEW,
        "post": Permission.ORGANIZATION_MANAGE,
    }

    parser_classes = [MultiPartParser]
    pagination_class = CursorPagination

    @extend_schema(responses=DocumentSerializer(many=True))
    def get(self, request, source_id):
        pages = CursorPagination(request, ordering=("-created_at", "-id"))
        source = _organization_source(request, source_id, Permission.ORGANIZATION_VIEW)
        return pages.response(
            selectors.documents_of(source), lambda page: DocumentSerializer(page, many=True).data
        )

    @extend_schema(request=DocumentUploadSerializer, responses={201: DocumentSerializer})
    def post(self, request, source_id):
        source = _organization_source(request, source_id, Permission.ORGANIZATION_MANAGE)
        services.check_accepts_uploads(source)
        serializer = DocumentUploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        document = services.document_upload(
            source=source,
            upload=serializer.validated_data["file"],
            title=serializer.validated_data.get("title", ""),
        )
        return Response(DocumentSerializer(document).data, status=status.HTTP_201_CREATED)


class DocumentView(APIView):
    required_permissions = {
        "get": Permission.ORGANIZATION_VIEW,
        "delete": Permission.ORGANIZATION_MANAGE,
    }

    @extend_schema(responses=DocumentSerializer)
    def get(self, request, document_id):
        return Response(
            DocumentSerializer(
                _organization_document(request, document_id, Permission.ORGANIZATION_VIEW)
            ).data
        )

    @extend_schema(responses={204: None})
    def delete(self, request, document_id):
        services.document_delete(
            _organization_document(request, document_id, Permission.ORGANIZATION_MANAGE)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class DocumentAccessView(APIView):
    """Admins: replace a document's access list; it holds for the next search."""

    required_permission = Permission.ORGANIZATION_MANAGE

    @extend_schema(request=AccessSerializer, responses=DocumentSerializer)
    def put(self, request, document_id):
        document = _organization_document(request, document_id, Permission.ORGANIZATION_MANAGE)
        serializer = AccessSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        document = services.document_set_access(document, serializer.validated_data["access"])
        return Response(DocumentSerializer(document).data)
