from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from quor.lib.serializers import StrictSerializer
from quor.selectors import make_model_id
from sandboxes.models import ExecRecord, Sandbox, Session
from webapps import services as webapp_services
from webapps.models import PublicLink, Tunnel

# Asked-for workload options that a sandbox may never have, and the error each gets.
REFUSED_SANDBOX_OPTIONS = {
    "privileged": ("sandboxes.privileged_refused", "Privileged sandboxes are not allowed."),
    "capabilities": ("sandboxes.capabilities_refused", "Extra capabilities are not allowed."),
    "cap_add": ("sandboxes.capabilities_refused", "Extra capabilities are not allowed."),
    "mounts": ("sandboxes.host_mounts_refused", "Host mounts are not allowed."),
    "volumes": ("sandboxes.host_mounts_refused", "Host mounts are not allowed."),
    "binds": ("sandboxes.host_mounts_refused", "Host mounts are not allowed."),
    "network_mode": ("sandboxes.host_network_refused", "Host networking is not allowed."),
    "host_network": ("sandboxes.host_network_refused", "Host networking is not allowed."),
}


class SessionSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField()
    apps = serializers.PrimaryKeyRelatedField(many=True, read_only=True)

    class Meta:
        model = Session
        fields = [
            "id",
            "title",
            "model",
            "status",
            "sharing",
            "skills",
            "apps",
            "created_at",
            "updated_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_model(self, session) -> str:
        return make_model_id(session.model_provider_id, session.model_name)


class SandboxSerializer(serializers.ModelSerializer):
    class Meta:
        model = Sandbox
        fields = [
            "id",
            "state",
            "failure_reason",
            "network_policy",
            "image_ref",
            "last_activity_at",
        ]
        read_only_fields = fields


@extend_schema_field({"type": "boolean", "enum": [True]})
class ConfirmField(serializers.BooleanField):
    """Only true starts (false is `sandboxes.confirmation_required`)."""


class StartEmptySerializer(StrictSerializer):
    confirm = ConfirmField(
        help_text="true: the earlier files are gone and the next start gives an empty workspace."
    )


class SandboxRequestSerializer(StrictSerializer):
    network_policy = serializers.ChoiceField(choices=Sandbox.NetworkPolicy.choices, required=False)


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "string", "pattern": "^[^\\x00]*$"},
        # OpenAPI 3.0 has no propertyNames: the names' rule is told in words.
        "description": "Variables for the command: names `[A-Za-z_][A-Za-z0-9_]*` (at most "
        "128), values without NUL; names or values that look like credentials are refused "
        "(`exec.secret_in_env`).",
    }
)
class EnvField(serializers.DictField):
    """Checked by the exec service (`exec.invalid_env`, `exec.secret_in_env`)."""


class UncheckedTextField(serializers.Field):
    """A string passed on as it is: the service that takes it checks it, with its own
    error code. Only a value that is not a string is refused here."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("Not a string.")
        return data

    def to_representation(self, value):
        return value


@extend_schema_field({"type": "string", "pattern": "^[^\\x00]*$"})
class ArgField(UncheckedTextField):
    """One argument: any text but a NUL byte (`exec.invalid_argv`)."""


class ExecRequestSerializer(StrictSerializer):
    argv = serializers.ListField(child=ArgField(), allow_empty=False)
    cwd = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    env = EnvField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False
    )
    timeout = serializers.FloatField(required=False, min_value=1)


@extend_schema_field({"type": "string"})
class ExecOutputField(serializers.Field):
    """A stream's kept bytes as text (undecodable bytes replaced)."""

    def to_representation(self, value) -> str:
        return bytes(value).decode(errors="replace")


class ExecResultSerializer(serializers.Serializer):
    id = serializers.UUIDField(help_text="The run's record in the session's exec journal.")
    exit_code = serializers.IntegerField()
    stdout = ExecOutputField(read_only=True)
    stderr = ExecOutputField(read_only=True)
    stdout_truncated = serializers.BooleanField()
    stderr_truncated = serializers.BooleanField()
    timed_out = serializers.BooleanField()
    duration_s = serializers.FloatField()


class ExecRecordSerializer(serializers.ModelSerializer):
    """A run in the exec journal, without its output."""

    argv = serializers.ListField(child=serializers.CharField(), read_only=True)
    env_names = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = ExecRecord
        fields = [
            "id",
            "via",
            "idempotency_key",
            "argv",
            "cwd",
            "env_names",
            "timeout_s",
            "status",
            "error",
            "exit_code",
            "timed_out",
            "stdout_truncated",
            "stderr_truncated",
            "duration_s",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class ExecRecordDetailSerializer(ExecRecordSerializer):
    """A run with the output it kept (QUOR_EXEC_OUTPUT_LIMIT bytes of each stream)."""

    stdout = ExecOutputField(read_only=True)
    stderr = ExecOutputField(read_only=True)

    class Meta(ExecRecordSerializer.Meta):
        fields = [*ExecRecordSerializer.Meta.fields, "stdout", "stderr"]
        read_only_fields = fields


class FileEntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.CharField()
    size = serializers.IntegerField()
    modified = serializers.FloatField(help_text="Seconds since the epoch.")
    managed = serializers.CharField(
        allow_null=True,
        help_text="One of Quor's own entries of the session's folder, null for the rest: "
        "`library` and `skills` (links to read-only copies of your Library and your "
        "organization's Skills; list `library/...` to see them) and `instructions` "
        "(AGENTS.md, the agent's instructions, written again at every turn).",
    )


class FileWrittenSerializer(serializers.Serializer):
    """The file an upload wrote."""

    name = serializers.CharField()
    size = serializers.IntegerField()


class ArchiveCheckSerializer(serializers.Serializer):
    """`check=1`: the archive that would be made."""

    name = serializers.CharField()
    size = serializers.IntegerField(help_text="The bytes of its files.")


class FileListingSerializer(serializers.Serializer):
    results = FileEntrySerializer(many=True, help_text="By name, at most QUOR_FILES_LIST_LIMIT.")
    truncated = serializers.BooleanField(help_text="The directory has more entries than these.")


class RuntimeIdentitySerializer(serializers.Serializer):
    sandbox = serializers.UUIDField()
    user = serializers.EmailField()
    session = serializers.UUIDField(allow_null=True)


class SessionCreateSerializer(StrictSerializer):
    prompt = serializers.CharField(trim_whitespace=False)
    model = serializers.CharField(help_text="An id from /api/v1/models/.")
    title = serializers.CharField(required=False, allow_blank=True, max_length=200)
    skills = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        max_length=50,
        help_text="Names of the organization's Skills to use.",
    )
    apps = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        max_length=100,
        help_text="Ids of the organization's Apps this session may use (from /api/v1/apps/).",
    )


class MessageSerializer(StrictSerializer):
    text = serializers.CharField(trim_whitespace=False)


class AgentEventSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    payload = serializers.JSONField()
    created_at = serializers.DateTimeField()


class AgentEventPageSerializer(serializers.Serializer):
    """Events after `after`, in order; `next` asks for the following ones (null: caught up)."""

    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True, help_text="Always null: events go forward.")
    results = AgentEventSerializer(many=True)


class RuntimeHeartbeatSerializer(StrictSerializer):
    turn = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="The turn the agent works on (the seq of its `session_started`): a post "
        "for a turn that has ended is refused with 409 `sessions.turn_ended`.",
    )


class RuntimeEventsSerializer(RuntimeHeartbeatSerializer):
    events = serializers.ListField(child=serializers.JSONField(), allow_empty=False)


@extend_schema_field({"type": "string", "enum": Session.Sharing.values})
class SharingField(serializers.CharField):
    """Checked by webapps.services.session_set_sharing (`webapps.invalid_sharing`)."""


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S"})
class TitleField(UncheckedTextField):
    """A session's title: 1 to 200 characters, not only spaces. Checked by
    session_rename (`sessions.invalid_title`)."""


class SessionUpdateSerializer(StrictSerializer):
    requires_a_field = True
    sharing = SharingField(
        required=False,
        help_text="Who may open the session's web apps: `private` (only you) or "
        "`organization` (every member of your organization). Never the conversation or files.",
    )
    title = TitleField(required=False)

    def validate(self, data):
        if not data:
            raise serializers.ValidationError("Send `sharing`, `title` or both.")
        return data


class RuntimeWebAppSerializer(StrictSerializer):
    # Checked by webapps.services.webapp_register (its own error codes).
    port = serializers.JSONField(help_text="The port the server listens on (1024-65535).")
    command = serializers.JSONField(help_text="The command that started it.")


class WebAppSerializer(serializers.Serializer):
    """A web server the agent started in the session (as webapps.services.webapp_payload)."""

    id = serializers.UUIDField()
    label = serializers.CharField()
    port = serializers.IntegerField()
    command = serializers.CharField()
    status = serializers.CharField()
    url = serializers.URLField(help_text="The app's own origin.")
    open_url = serializers.CharField(
        help_text="On Quor's origin: logs the viewer in and hands them off to the app."
    )


class PublicLinkCreateSerializer(StrictSerializer):
    """Checked further by webapps.services.public_link_create (its own error codes)."""

    webapp = serializers.UUIDField(help_text="The session's web app the link opens.")
    expires_at = serializers.DateTimeField(
        help_text="When the link stops working: in the future, at most "
        "QUOR_PUBLIC_LINK_MAX_DAYS away (`webapps.invalid_link_expiry`)."
    )
    visitor_auth = serializers.ChoiceField(
        choices=PublicLink.VisitorAuth.choices,
        required=False,
        default=PublicLink.VisitorAuth.NONE,
        help_text="`none`: anyone with the link; `password`: visitors give `password`; "
        "`email`: visitors give an email address of `email_domains` and the one-time code "
        "mailed to it (`webapps.email_not_configured` without QUOR_EMAIL_HOST).",
    )
    password = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=200,
        write_only=True,
        help_text="For `password` links: 8 to 200 characters (`webapps.invalid_link_password`).",
    )
    email_domains = serializers.ListField(
        child=serializers.RegexField(
            webapp_services.EMAIL_DOMAIN_PATTERN,
            max_length=webapp_services.MAX_EMAIL_DOMAIN_CHARS,
        ),
        required=False,
        max_length=webapp_services.MAX_LINK_EMAIL_DOMAINS,
        help_text="For `email` links: 1 to 20 lowercase domains whose addresses may open it, "
        "each exactly (`example.com` admits no `a.example.com`; no wildcards) "
        "(`webapps.invalid_link_email_domains`).",
    )
    requests_per_minute = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.QUOR_PUBLIC_LINK_MAX_REQUESTS_PER_MINUTE,
        help_text="Visitors' requests per minute, across every proxy (default: the most).",
    )
    bandwidth_bytes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.QUOR_PUBLIC_LINK_MAX_BANDWIDTH_BYTES,
        help_text="Bytes the link may serve over its life (default: the most).",
    )


class PublicLinkSerializer(serializers.Serializer):
    """A public link to a web app (as webapps.services.public_link_payload)."""

    id = serializers.UUIDField()
    webapp = serializers.UUIDField()
    url = serializers.URLField(help_text="The link: an origin of its own, not the app's.")
    visitor_auth = serializers.ChoiceField(choices=PublicLink.VisitorAuth.choices)
    email_domains = serializers.ListField(
        child=serializers.CharField(), help_text="For `email` links: who may open it."
    )
    requests_per_minute = serializers.IntegerField()
    bandwidth_bytes = serializers.IntegerField()
    expires_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()


class TunnelSerializer(serializers.Serializer):
    """An open local relay tunnel (as webapps.tunnels.tunnel_payload)."""

    id = serializers.UUIDField()
    url = serializers.URLField(help_text="The tunnel's URL, an origin of its own.")
    port = serializers.IntegerField(help_text="The loopback port its client relays to.")
    sharing = serializers.ChoiceField(choices=Tunnel.Sharing.choices)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(help_text="Its hard end, connected or not.")


class TunnelUpdateSerializer(serializers.Serializer):
    sharing = serializers.ChoiceField(
        choices=Tunnel.Sharing.choices,
        help_text="`organization`: every member of your organization may open it, as "
        "a web app shared with them.",
    )


class PublicLinkVisitSerializer(serializers.Serializer):
    """A visitor who opened the link: the first request of a browser, or a password or
    an email's one-time code accepted."""

    opened_at = serializers.DateTimeField()
    address = serializers.IPAddressField(allow_null=True)
    user_agent = serializers.CharField()
    authenticated_by = serializers.CharField(help_text="`password`, `email`, or empty.")
    email = serializers.CharField(help_text="The address an email link's code went to, or empty.")


class LibraryFileSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.SerializerMethodField()
    sha256 = serializers.CharField()
    updated_at = serializers.DateTimeField()

    def get_size(self, item) -> int:
        return item.blob.size
