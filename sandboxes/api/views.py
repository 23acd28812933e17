from django.conf import settings
from django.db import transaction
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser, JSONParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from quor.lib.errors import InvalidInput, NotFound, QuorError
from quor.lib.pagination import NEWEST_FIRST, CursorPagination, page_size_from
from quor.lib.permissions import SANDBOX_CREDENTIAL, Permission
from quor.lib.streaming import StreamedResponse
from quor.models import ServiceAccount
from sandboxes import selectors
from sandboxes.api.authentication import SandboxCredentialAuthentication
from sandboxes.api.serializers import (
    REFUSED_SANDBOX_OPTIONS,
    AgentEventPageSerializer,
    AgentEventSerializer,
    ArchiveCheckSerializer,
    ExecRecordDetailSerializer,
    ExecRecordSerializer,
    ExecRequestSerializer,
    ExecResultSerializer,
    FileEntrySerializer,
    FileListingSerializer,
    FileWrittenSerializer,
    LibraryFileSerializer,
    MessageSerializer,
    RuntimeEventsSerializer,
    RuntimeHeartbeatSerializer,
    RuntimeIdentitySerializer,
    RuntimeWebAppSerializer,
    SandboxRequestSerializer,
    SandboxSerializer,
    SessionCreateSerializer,
    SessionSerializer,
    SessionUpdateSerializer,
    StartEmptySerializer,
)
from sandboxes.library import files as library
from sandboxes.models import Session
from sandboxes.runtime import services
from sandboxes.sessions import services as sessions
from webapps import services as webapp_services
from webapps.api.serializers import WebAppSerializer

# Images the file browser may show inline (never SVG: it can carry scripts).
PREVIEWABLE_IMAGES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}
SESSION_ID = OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH)
SESSION_ID_IN_PATH = OpenApiParameter("session_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
# Most events one GET /api/v1/sessions/{id}/events/ returns (the rest: its `next` link).
EVENTS_PER_PAGE = 1000
PATH = OpenApiParameter(
    "path",
    {"type": "string", "pattern": "^(?:$|[^/])"},
    OpenApiParameter.QUERY,
    description="A folder inside the workspace, relative (none: the top).",
)
FILE_PATH = OpenApiParameter(
    "path",
    {"type": "string", "minLength": 1, "pattern": "^[^/]"},
    OpenApiParameter.QUERY,
    required=True,
    description="The file, relative to the workspace (or the Library).",
)


@extend_schema_view(retrieve=extend_schema(parameters=[SESSION_ID]))
class SessionViewSet(viewsets.ViewSet):
    required_permission = Permission.SANDBOX_USE
    required_scopes = {
        "list": ServiceAccount.Scope.SESSIONS,
        "retrieve": ServiceAccount.Scope.SESSIONS,
        "create": ServiceAccount.Scope.SESSIONS,
        "cancel": ServiceAccount.Scope.SESSIONS,
        "messages": ServiceAccount.Scope.SESSIONS,
        "events": ServiceAccount.Scope.EVENTS,
    }
    serializer_class = SessionSerializer
    pagination_class = CursorPagination
    parser_classes = [JSONParser, MultiPartParser]  # multipart: a new session's attachments

    def get_parsers(self):
        """Multipart only where files come (create); JSON elsewhere, as the schema says."""
        action = getattr(self, "action", None)
        if action is None and getattr(self, "request", None) is not None:
            action = getattr(self, "action_map", {}).get(self.request.method.lower())
        if action not in (None, "create"):
            return [JSONParser()]
        return super().get_parsers()

    def list(self, request):
        """The user's sessions, newest first (paginated)."""
        pages = CursorPagination(request, ordering=NEWEST_FIRST)
        return pages.response(
            selectors.sessions_of(request.user),
            lambda page: SessionSerializer(page, many=True).data,
        )

    def retrieve(self, request, pk=None):
        session = services.session_in_use(request.user, pk)
        return Response(SessionSerializer(session).data)

    @extend_schema(request=SessionCreateSerializer, responses={201: SessionSerializer})
    def create(self, request):
        """Starts a session: the agent works on the prompt in the user's sandbox. Send
        JSON, or multipart with `attachments` files (copied into `attachments/`)."""
        if not isinstance(request.data, dict):  # JSON that is not an object
            raise InvalidInput(fields={"non_field_errors": ["Send a JSON object."]})
        fields = request.data.copy()  # a QueryDict for multipart: lists stay lists
        if isinstance(fields, dict):
            fields.pop("attachments", None)
        serializer = SessionCreateSerializer(data=fields)
        serializer.is_valid(raise_exception=True)
        session = sessions.session_create(
            user=request.user,
            attachments=request.FILES.getlist("attachments"),
            **serializer.validated_data,
        )
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[SESSION_ID], request=SessionUpdateSerializer, responses=SessionSerializer
    )
    def partial_update(self, request, pk=None):
        """Renames the session (`title`) or changes who may open its web apps
        (`sharing`); owner only. Nothing changes if either is refused."""
        session = services.session_in_use(request.user, pk)
        serializer = SessionUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        changes = serializer.validated_data
        with transaction.atomic():
            if "title" in changes:
                session = sessions.session_rename(
                    user=request.user, session=session, title=changes["title"]
                )
            if "sharing" in changes:
                session = webapp_services.session_set_sharing(
                    user=request.user, session=session, sharing=changes["sharing"]
                )
        return Response(SessionSerializer(session).data)

    @extend_schema(parameters=[SESSION_ID], responses={204: None})
    def destroy(self, request, pk=None):
        """Deletes the session, its conversation, attachments and web apps; refused (409
        `sessions.busy`) while the agent works. Its files stay in the sandbox."""
        session = services.session_in_use(request.user, pk)
        sessions.session_delete(user=request.user, session=session)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        parameters=[SESSION_ID], request=MessageSerializer, responses={202: SessionSerializer}
    )
    @action(detail=True, methods=["post"])
    def messages(self, request, pk=None):
        """A follow-up message: the agent continues the same conversation."""
        session = services.session_in_use(request.user, pk)
        serializer = MessageSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        session = sessions.session_message(
            user=request.user, session=session, text=serializer.validated_data["text"]
        )
        return Response(SessionSerializer(session).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(parameters=[SESSION_ID], request=None, responses=SessionSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        session = services.session_in_use(request.user, pk)
        session = sessions.session_cancel(user=request.user, session=session)
        return Response(SessionSerializer(session).data)

    @extend_schema(
        parameters=[
            SESSION_ID,
            OpenApiParameter(
                "after",
                {"type": "integer", "minimum": 0},
                OpenApiParameter.QUERY,
                description="The last seq already seen (default 0: from the start).",
            ),
            OpenApiParameter(
                "page_size",
                OpenApiTypes.INT,
                OpenApiParameter.QUERY,
                description=f"Events per call (default and most: {EVENTS_PER_PAGE}).",
            ),
        ],
        responses=AgentEventPageSerializer,
        operation_id="v1_sessions_events_list",
    )
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        """The session's events after seq `after`, in order, at most `page_size` per call.
        `next` is the same request `after` the last seq returned, null once caught up."""
        after = _non_negative_int(request.query_params.get("after", "0"), "after")
        size = page_size_from(request, default=EVENTS_PER_PAGE, maximum=EVENTS_PER_PAGE)
        session = services.session_in_use(request.user, pk)
        events = selectors.events_after(session, after, limit=size + 1)
        page, following = events[:size], None
        if len(events) > size:
            following = replace_query_param(request.build_absolute_uri(), "after", page[-1].seq)
        results = AgentEventSerializer(page, many=True).data
        return Response({"next": following, "previous": None, "results": results})


class MySandboxView(APIView):
    required_permission = Permission.SANDBOX_USE

    @extend_schema(responses=SandboxSerializer)
    def get(self, request):
        return Response(SandboxSerializer(selectors.get_sandbox_for_user(request.user)).data)

    @extend_schema(request=SandboxRequestSerializer, responses={202: SandboxSerializer})
    def post(self, request):
        """Asks for the sandbox to be running; the work happens in the background."""
        if isinstance(request.data, dict):
            for option, (code, message) in REFUSED_SANDBOX_OPTIONS.items():
                if option in request.data:
                    raise InvalidInput(message, code=code)
        serializer = SandboxRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        sandbox = services.sandbox_request(
            user=request.user, network_policy=serializer.validated_data.get("network_policy")
        )
        return Response(SandboxSerializer(sandbox).data, status=status.HTTP_202_ACCEPTED)


class StartEmptyView(APIView):
    required_permission = Permission.SANDBOX_USE

    @extend_schema(request=StartEmptySerializer, responses=SandboxSerializer)
    def post(self, request):
        """For a sandbox whose workspace cannot be restored only: starts it again with an
        empty workspace (recorded). `{"confirm": true}` is required."""
        serializer = StartEmptySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if not serializer.validated_data["confirm"]:
            raise InvalidInput(
                'Confirm that the earlier files are gone: {"confirm": true}.',
                code="sandboxes.confirmation_required",
            )
        sandbox = services.sandbox_start_empty(
            sandbox=selectors.get_sandbox_for_user(request.user), actor=request.user, via="api"
        )
        return Response(SandboxSerializer(sandbox).data)


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "pattern": r"^[\x21-\x7e]{1,255}$"},
    OpenApiParameter.HEADER,
    description="Any unique value (a UUID): a retry with the same key and request gets "
    "the first run's result (`Idempotent-Replayed: true`) instead of a second run, 409 "
    "`exec.in_progress` while it runs (with `Retry-After`) or `exec.interrupted` if its "
    "process died, and 422 with another request. Kept QUOR_EXEC_JOURNAL_RETENTION_DAYS.",
)


class SessionExecView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.EXEC

    @extend_schema(
        parameters=[SESSION_ID_IN_PATH, IDEMPOTENCY_KEY],
        request=ExecRequestSerializer,
        responses=ExecResultSerializer,
    )
    def post(self, request, session_id):
        """Runs argv (never a shell string) in the session's workspace, as the sandbox
        user; the run is in the session's exec journal before it starts."""
        session = services.session_in_use(request.user, session_id)
        serializer = ExecRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        record = services.sandbox_exec(
            user=request.user,
            session=session,
            argv=data["argv"],
            cwd=data.get("cwd"),
            env=data.get("env"),
            timeout_s=data.get("timeout"),
            idempotency_key=request.headers.get("Idempotency-Key"),
        )
        headers = {"Idempotent-Replayed": "true"} if record.replayed else None
        return Response(ExecResultSerializer(record).data, headers=headers)


class SessionExecRecordViewSet(viewsets.ViewSet):
    """The session's exec journal: every command run through the API, newest first."""

    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.EXEC
    pagination_class = CursorPagination

    @extend_schema(parameters=[SESSION_ID_IN_PATH], responses=ExecRecordSerializer(many=True))
    def list(self, request, session_id):
        pages = CursorPagination(request, ordering=("-started_at", "-id"))
        session = services.session_in_use(request.user, session_id)
        return pages.response(
            selectors.exec_records_of(session),
            lambda page: ExecRecordSerializer(page, many=True).data,
        )

    @extend_schema(
        parameters=[
            SESSION_ID_IN_PATH,
            OpenApiParameter("exec_id", OpenApiTypes.UUID, OpenApiParameter.PATH),
        ],
        responses=ExecRecordDetailSerializer,
    )
    def retrieve(self, request, session_id, exec_id):
        """One run, with the output it kept."""
        session = services.session_in_use(request.user, session_id)
        return Response(
            ExecRecordDetailSerializer(selectors.get_exec_record(session, exec_id)).data
        )


class SessionFilesView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.FILES

    @extend_schema(
        parameters=[SESSION_ID_IN_PATH, PATH],
        responses=FileListingSerializer,
        operation_id="v1_sessions_files_list",
    )
    def get(self, request, session_id):
        """The directory's entries by name, at most QUOR_FILES_LIST_LIMIT; `truncated`
        says there are more (list a subdirectory, or use exec, to see them)."""
        session = services.session_in_use(request.user, session_id)
        entries = services.session_files_list(
            session=session, path=request.query_params.get("path", "")
        )
        limit = settings.QUOR_FILES_LIST_LIMIT
        results = FileEntrySerializer(entries[:limit], many=True).data
        return Response({"results": results, "truncated": len(entries) > limit})


class SessionFileArchiveView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.FILES

    @extend_schema(
        parameters=[
            SESSION_ID_IN_PATH,
            PATH,
            OpenApiParameter(
                "check",
                {"type": "string", "enum": ["0", "1"]},
                OpenApiParameter.QUERY,
                description="`1`: only whether the archive would be made (JSON `name` and "
                "`size`, the bytes of its files), or the same refusal; no archive.",
            ),
        ],
        responses={
            (200, "application/gzip"): OpenApiTypes.BINARY,
            (200, "application/json"): ArchiveCheckSerializer,
        },
    )
    def get(self, request, session_id):
        """The folder at `path` (the whole session without it) as a .tar.gz, made in the
        sandbox; the whole session's leaves out Quor's own entries (`.quor/`, `library`,
        `skills`, AGENTS.md). Refused (413, `files.archive_too_large`) when its files add
        up to more than QUOR_FILES_ARCHIVE_MAX_BYTES. Files changed while they are read
        are archived as read; files the sandbox user cannot read are left out."""
        session = services.session_in_use(request.user, session_id)
        path = request.query_params.get("path", "")
        check = request.query_params.get("check", "0")
        if check not in ("0", "1"):
            raise InvalidInput("check is 0 or 1.", fields={"check": ["Not 0 or 1."]})
        if check == "1":
            return Response(services.session_files_archive_check(session=session, path=path))
        name, chunks = services.session_files_archive(session=session, path=path)
        response = StreamedResponse(chunks, content_type="application/gzip")
        response["Content-Disposition"] = content_disposition_header(True, name)
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response


class RawBodyParser(BaseParser):
    """Leaves the body unread so the view can stream it into the sandbox."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream


def _body_chunks(stream, size: int):
    remaining = size
    while remaining and (chunk := stream.read(min(remaining, 1 << 16))):
        remaining -= len(chunk)
        yield chunk


class SessionFileContentView(APIView):
    required_permission = Permission.SANDBOX_USE
    required_scope = ServiceAccount.Scope.FILES
    parser_classes = [RawBodyParser]

    @extend_schema(
        parameters=[SESSION_ID_IN_PATH, FILE_PATH],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
    )
    def get(self, request, session_id):
        """Streams the file; symlinks and paths outside the workspace are refused."""
        session = services.session_in_use(request.user, session_id)
        path = request.query_params.get("path", "")
        info, chunks = services.session_file_open(session=session, path=path)
        filename = info["name"]
        image_type = PREVIEWABLE_IMAGES.get(filename.rsplit(".", 1)[-1].lower())
        inline = request.query_params.get("inline") == "1" and image_type is not None
        response = StreamedResponse(
            chunks, content_type=image_type if inline else "application/octet-stream"
        )
        response["Content-Length"] = str(info["size"])
        response["Content-Disposition"] = content_disposition_header(not inline, filename)
        response["X-Content-Type-Options"] = "nosniff"
        # Files are the agent's output: never let one run as a page on Quor's origin.
        response["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response

    @extend_schema(
        parameters=[SESSION_ID_IN_PATH, FILE_PATH],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={201: FileWrittenSerializer},
    )
    def post(self, request, session_id):
        """Uploads the raw request body as the file at `path` (replacing it)."""
        session = services.session_in_use(request.user, session_id)
        size = request.META.get("CONTENT_LENGTH")
        if not size:
            raise QuorError(
                "Uploads need a Content-Length header.", code="files.length_required", status=411
            )
        result = services.session_file_write(
            session=session,
            path=request.query_params.get("path", ""),
            chunks=_body_chunks(request.data, int(size)),
            size=int(size),
        )
        return Response(result, status=status.HTTP_201_CREATED)


class RuntimeWhoAmIView(APIView):
    """Sandbox-facing: who the calling sandbox is (and its session, as the proxy says)."""

    authentication_classes = [SandboxCredentialAuthentication]
    required_permission = SANDBOX_CREDENTIAL

    @extend_schema(responses=RuntimeIdentitySerializer)
    def get(self, request):
        sandbox = request.auth
        session_id = request.headers.get("X-Quor-Session", "")
        session = selectors.session_of_sandbox(sandbox, session_id)
        return Response(
            RuntimeIdentitySerializer(
                {
                    "sandbox": sandbox.pk,
                    "user": request.user.email,
                    "session": session and session.pk,
                }
            ).data
        )


def _non_negative_int(value: str, name: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise InvalidInput(f"{name} must be a non-negative integer.", code="invalid_input")
    return int(value)


def _runtime_session(request, session_id: str) -> Session:
    """The session, if it is one of the calling sandbox's."""
    session = selectors.session_of_sandbox(request.auth, session_id)
    if session is None:
        raise NotFound("No such session in this sandbox.")
    return session


class RuntimeSessionEventsView(APIView):
    """Sandbox-facing: the agent runtime reports its events here."""

    authentication_classes = [SandboxCredentialAuthentication]
    required_permission = SANDBOX_CREDENTIAL

    @extend_schema(parameters=[SESSION_ID_IN_PATH], request=RuntimeEventsSerializer, responses=None)
    def post(self, request, session_id):
        session = _runtime_session(request, session_id)
        serializer = RuntimeEventsSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        last_seq = sessions.session_events_report(
            session=session,
            events=serializer.validated_data["events"],
            turn=serializer.validated_data.get("turn"),
        )
        return Response({"last_seq": last_seq})


class RuntimeSessionHeartbeatView(APIView):
    """Sandbox-facing: the agent runtime says it is still working on the session's turn
    (409 `sessions.turn_ended` once its turn has ended: the agent then stops)."""

    authentication_classes = [SandboxCredentialAuthentication]
    required_permission = SANDBOX_CREDENTIAL

    @extend_schema(
        parameters=[SESSION_ID_IN_PATH], request=RuntimeHeartbeatSerializer, responses={204: None}
    )
    def post(self, request, session_id):
        session = _runtime_session(request, session_id)
        serializer = RuntimeHeartbeatSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        sessions.session_agent_heartbeat(
            session=session, turn=serializer.validated_data.get("turn")
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class RuntimeSessionWebAppsView(APIView):
    """Sandbox-facing: the agent runtime registers a web server it started in the session."""

    authentication_classes = [SandboxCredentialAuthentication]
    required_permission = SANDBOX_CREDENTIAL

    @extend_schema(
        parameters=[SESSION_ID_IN_PATH],
        request=RuntimeWebAppSerializer,
        responses={201: WebAppSerializer},
    )
    def post(self, request, session_id):
        session = _runtime_session(request, session_id)
        serializer = RuntimeWebAppSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        webapp = webapp_services.webapp_register(session=session, **serializer.validated_data)
        return Response(webapp_services.webapp_payload(webapp), status=status.HTTP_201_CREATED)


class LibraryView(APIView):
    """The user's library: files available in every session (in `library/`)."""

    required_permission = Permission.SANDBOX_USE
    parser_classes = [RawBodyParser]
    pagination_class = CursorPagination

    @extend_schema(responses=LibraryFileSerializer(many=True))
    def get(self, request):
        """The user's library files, by path (paginated)."""
        pages = CursorPagination(request, ordering=("path",))
        return pages.response(
            selectors.library_files_of(request.user),
            lambda page: LibraryFileSerializer(page, many=True).data,
        )

    @extend_schema(
        parameters=[FILE_PATH],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={201: LibraryFileSerializer},
    )
    def put(self, request):
        """Stores the raw body as the library file at `path` (replacing it), streamed."""
        size = int(request.META.get("CONTENT_LENGTH") or 0)
        item = library.library_file_put(
            user=request.user,
            path=request.query_params.get("path", ""),
            content=_body_chunks(request.data, size),
        )
        return Response(LibraryFileSerializer(item).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[FILE_PATH], responses={204: None})
    def delete(self, request):
        library.library_file_delete(user=request.user, path=request.query_params.get("path", ""))
        return Response(status=status.HTTP_204_NO_CONTENT)
