from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from quor.lib.serializers import StrictSerializer
from quor.selectors import make_model_id
from sandboxes.models import ExecRecord, Sandbox, Session

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


class LibraryFileSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.SerializerMethodField()
    sha256 = serializers.CharField()
    updated_at = serializers.DateTimeField()

    def get_size(self, item) -> int:
        return item.blob.size
