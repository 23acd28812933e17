"""Per-user sandboxes, the sessions that run in them, and the sessions' events."""

import hashlib
import secrets
import uuid

from django.conf import settings
from django.db import models

from quor.lib.fields import EncryptedCharField


def new_placeholder() -> str:
    """What the sandbox holds instead of every credential; random per sandbox."""
    return f"quor-placeholder-{secrets.token_hex(16)}"


def new_secret_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Sandbox(models.Model):
    """One per user: the runtime instance (a container) where that user's sessions run."""

    class State(models.TextChoices):
        ABSENT = "absent", "Absent"
        PROVISIONING = "provisioning", "Provisioning"
        RUNNING = "running", "Running"
        SNAPSHOTTING = "snapshotting", "Going to sleep"
        SLEEPING = "sleeping", "Sleeping"
        RESTORING = "restoring", "Waking up"
        STOPPING = "stopping", "Stopping"
        STOPPED = "stopped", "Stopped"
        FAILED = "failed", "Failed"
        # Its workspace cannot be restored: only an explicit action starts it empty.
        UNRESTORABLE = "unrestorable", "Workspace cannot be restored"

    class NetworkPolicy(models.TextChoices):
        DENY = "deny", "Deny (Quor API only)"
        RESTRICTED = "restricted", "Restricted (providers, Apps, allowlist)"
        OPEN = "open", "Open (any public destination)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sandbox"
    )
    backend = models.CharField(max_length=20, default="docker")
    runtime_key = models.CharField(
        max_length=64,
        blank=True,
        help_text="The id its runtime and workspace carry in the backend, when they came "
        "from the warm pool; blank: its own id.",
    )
    runtime_id = models.CharField(max_length=200, blank=True, help_text="Container id.")
    image_ref = models.CharField(max_length=200, blank=True, help_text="Image id it runs.")
    state = models.CharField(max_length=20, choices=State.choices, default=State.ABSENT)
    failure_reason = models.TextField(blank=True)
    network_policy = models.CharField(
        max_length=20, choices=NetworkPolicy.choices, default=NetworkPolicy.OPEN
    )
    network_address = models.GenericIPAddressField(
        null=True,
        blank=True,
        help_text="Its address on the sandbox bridge: how the proxy knows it.",
    )
    placeholder = models.CharField(
        max_length=64,
        default=new_placeholder,
        editable=False,
        help_text="Stands in for every credential inside the sandbox; the proxy replaces it.",
    )
    proxy_token = EncryptedCharField(max_length=100, default=new_secret_token, editable=False)
    runtime_credential = EncryptedCharField(max_length=100, blank=True, editable=False)
    runtime_credential_hash = models.CharField(
        max_length=64, blank=True, db_index=True, editable=False
    )
    has_workspace = models.BooleanField(
        default=False,
        help_text="The user has a workspace (in a runtime or in snapshots) that Quor never "
        "replaces with an empty one unless someone asks (WorkspaceReset).",
    )
    newer_than_snapshot = models.BooleanField(
        default=False,
        help_text="The workspace may hold changes its newest snapshot lacks: set when a "
        "runtime starts with it, cleared when a sleep has snapshotted it.",
    )
    last_activity_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["runtime_key"],
                condition=~models.Q(runtime_key=""),
                name="sandbox_runtime_key_unique",
            )
        ]

    def __str__(self):
        return f"sandbox of {self.user}"

    @property
    def backend_sandbox_id(self) -> str:
        """What every backend call names this sandbox by."""
        return self.runtime_key or str(self.pk)


def new_pool_key() -> str:
    return str(uuid.uuid4())


class PooledRuntime(models.Model):
    """A ready runtime (and its empty workspace) that no sandbox has taken yet: it holds
    no user's data, identity or placeholder. A sandbox that takes one deletes its row and
    goes on under its key (Sandbox.runtime_key)."""

    class State(models.TextChoices):
        CREATING = "creating", "Creating"
        READY = "ready", "Ready"

    key = models.CharField(max_length=64, primary_key=True, default=new_pool_key, editable=False)
    backend = models.CharField(max_length=20)
    state = models.CharField(max_length=20, choices=State.choices, default=State.CREATING)
    image_ref = models.CharField(max_length=200, blank=True)
    runtime_id = models.CharField(max_length=200, blank=True)
    network_address = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self):
        return f"pooled runtime {self.key} ({self.state})"


class WorkspaceReset(models.Model):
    """A user's workspace replaced: started empty after it could not be restored or
    removed with its snapshots (on purpose, by someone), or lost while in use and woken
    from an older snapshot. Who did it and what it replaced."""

    class Action(models.TextChoices):
        STARTED_EMPTY = "started_empty", "Started with an empty workspace"
        REMOVED = "removed", "Workspace and snapshots removed"
        RESTORED_OLDER = "restored_older", "Lost in use; restored from an older snapshot"

    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="resets")
    action = models.CharField(max_length=20, choices=Action.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    via = models.CharField(max_length=40, help_text="The page, the API or an operator command.")
    replaced = models.TextField(blank=True, help_text="The sandbox's state and failure then.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.get_action_display()} ({self.sandbox_id}, {self.created_at:%Y-%m-%d %H:%M})"


class Snapshot(models.Model):
    """A sleeping sandbox's workspace (compressed tar, without the managed area) in the
    file store. For sleep and wake only, not version history: the newest
    QUOR_SNAPSHOT_KEEP good ones are kept."""

    class Status(models.TextChoices):
        GOOD = "good", "Good"
        DAMAGED = "damaged", "Damaged"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="snapshots")
    blob = models.ForeignKey("quor.StoredBlob", on_delete=models.PROTECT, related_name="+")
    size = models.BigIntegerField(help_text="Compressed bytes in the file store.")
    sha256 = models.CharField(max_length=64)
    workspace_bytes = models.BigIntegerField(help_text="Bytes of the uncompressed archive.")
    image_ref = models.CharField(max_length=200, blank=True, help_text="Image the runtime ran.")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.GOOD)
    problem = models.TextField(blank=True, help_text="Why it is damaged.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["sandbox", "-created_at"]

    def __str__(self):
        return f"snapshot of {self.sandbox_id} at {self.created_at:%Y-%m-%d %H:%M}"


class Session(models.Model):
    """One conversation with the agent, with its own workspace directory in the sandbox."""

    class Status(models.TextChoices):
        # Labels are what the user sees: "waiting" is a turn that ended and awaits a
        # follow-up, which to a person is simply done.
        PENDING = "pending", "Starting"
        RUNNING = "running", "Working"
        WAITING = "waiting", "Done"
        FINISHED = "finished", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Stopped by you"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sessions"
    )
    sandbox = models.ForeignKey(Sandbox, on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    model_provider = models.ForeignKey(
        "quor.ModelProvider", on_delete=models.PROTECT, related_name="sessions"
    )
    model_name = models.CharField(max_length=200)

    class Sharing(models.TextChoices):
        PRIVATE = "private", "Private (only me)"
        ORGANIZATION = "organization", "My organization"

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    sharing = models.CharField(
        max_length=12,
        choices=Sharing.choices,
        default=Sharing.PRIVATE,
        help_text="Who may open the session's web apps (never the conversation or files).",
    )
    confidential = models.BooleanField(
        default=False,
        help_text="Set by an organization admin: no public link to this session's web apps; "
        "existing links stop working at once.",
    )
    skills = models.JSONField(default=list, blank=True, help_text="Names of the Skills chosen.")
    apps = models.ManyToManyField(
        "integrations.App",
        blank=True,
        related_name="sessions",
        help_text="The Apps this session may use with their credentials.",
    )
    proxy_token = EncryptedCharField(max_length=100, default=new_secret_token, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    agent_seen_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When the running turn's agent last reported (an event or a heartbeat).",
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.title or str(self.id)


class Attachment(models.Model):
    """A file attached to a new session, kept in the file store so that it can be copied
    into the session's workspace again (a restored sandbox)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="attachments")
    name = models.CharField(max_length=255)
    blob = models.ForeignKey(
        "quor.StoredBlob", on_delete=models.PROTECT, editable=False, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "created_at", "pk"]

    def __str__(self):
        return self.name


class AgentEvent(models.Model):
    """Something that happened in a session; seq orders a session's events without gaps."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=50)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="agent_event_seq_unique")
        ]
        # Each report of the runtime checks its turn (the newest `session_started`) first:
        # without it, that reads every event of the turn so far.
        indexes = [
            models.Index(
                fields=["session", "seq"],
                condition=models.Q(kind="session_started"),
                name="agent_event_turn_starts",
            )
        ]

    def __str__(self):
        return f"{self.session_id} #{self.seq} {self.kind}"


class Skill(models.Model):
    """An organization's Skill: instructions and files (scripts, templates) that the
    agent can use. Skill bundles can contain executable scripts: review them as code."""

    organization = models.ForeignKey(
        "quor.Organization", on_delete=models.CASCADE, related_name="skills"
    )
    name = models.SlugField(max_length=100, help_text="Its folder name in the sandbox.")
    description = models.CharField(max_length=500, help_text="Shown to the agent in AGENTS.md.")
    bundle = models.ForeignKey(
        "quor.StoredBlob",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        editable=False,
        related_name="+",
        help_text="Its files: a tar archive in the file store (none: no files).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["organization", "name"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="skill_name_unique")
        ]

    def __str__(self):
        return self.name


class LibraryFile(models.Model):
    """A file of a user's User Library: available in every session of that user."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="library_files"
    )
    path = models.CharField(max_length=500)
    blob = models.ForeignKey(
        "quor.StoredBlob", on_delete=models.PROTECT, editable=False, related_name="+"
    )
    sha256 = models.CharField(max_length=64, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["owner", "path"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "path"], name="library_path_unique")
        ]

    def __str__(self):
        return self.path


class ScheduledTask(models.Model):
    """A prompt that Celery beat runs as a new session on a cron schedule, with nobody
    present: Ask actions of the pre-approved Apps go through, others fail at once."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="scheduled_tasks"
    )
    name = models.CharField(max_length=200)
    prompt = models.TextField()
    cron = models.CharField(max_length=100, help_text="Five fields: minute hour day month weekday.")
    timezone = models.CharField(max_length=64, default="UTC")
    model_provider = models.ForeignKey(
        "quor.ModelProvider", on_delete=models.PROTECT, related_name="scheduled_tasks"
    )
    model_name = models.CharField(max_length=200)
    skills = models.JSONField(default=list, blank=True)
    apps = models.ManyToManyField("integrations.App", blank=True, related_name="scheduled_tasks")
    preapproved_apps = models.ManyToManyField(
        "integrations.App",
        blank=True,
        related_name="preapproved_in_tasks",
        help_text="Apps whose Ask actions go through during a run (Deny still applies).",
    )
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["owner", "name"]

    def __str__(self):
        return self.name


class ScheduledRun(models.Model):
    """One due time of a scheduled task, and what became of it."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        FAILED = "failed", "Failed"
        SKIPPED = "skipped", "Skipped"

    task = models.ForeignKey(ScheduledTask, on_delete=models.CASCADE, related_name="runs")
    scheduled_for = models.DateTimeField()
    session = models.OneToOneField(
        Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="scheduled_run"
    )
    status = models.CharField(max_length=10, choices=Status.choices)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "scheduled_for"], name="scheduled_run_once_per_time"
            )
        ]

    def __str__(self):
        return f"{self.task} at {self.scheduled_for:%Y-%m-%d %H:%M}"


class ExecRecord(models.Model):
    """One command run in a sandbox through the API, a manage command or the terminal,
    written before it starts: a retry with the same idempotency key gets this run's
    result instead of a second run, and a run whose process died says so."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        NOT_STARTED = "not_started", "Not started"
        INTERRUPTED = "interrupted", "Interrupted"

    class Via(models.TextChoices):
        API = "api", "API"
        COMMAND = "command", "Manage command"
        TERMINAL = "terminal", "Terminal"
        SHELL = "shell", "Terminal command"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "quor.Organization", on_delete=models.CASCADE, related_name="exec_records"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="exec_records"
    )
    session = models.ForeignKey(
        Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="exec_records"
    )
    via = models.CharField(max_length=10, choices=Via.choices)
    idempotency_key = models.CharField(max_length=255, blank=True)
    request_hash = models.CharField(
        max_length=64,
        help_text="sha256 of the request: a key sent again with another one is refused.",
    )
    argv = models.JSONField()
    cwd = models.CharField(max_length=4096)
    env_names = models.JSONField(
        default=list, help_text="The names of the variables the caller set; never their values."
    )
    timeout_s = models.FloatField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RUNNING)
    runner = models.CharField(
        max_length=200, help_text="The process that runs it: host, pid and a per-process token."
    )
    error = models.TextField(blank=True, help_text="Why it did not start, or was interrupted.")
    exit_code = models.IntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    stdout = models.BinaryField(default=b"")
    stderr = models.BinaryField(default=b"")
    stdout_truncated = models.BooleanField(default=False)
    stderr_truncated = models.BooleanField(default=False)
    duration_s = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField()
    deadline = models.DateTimeField(
        help_text="Past this, a record still running is interrupted: the command's "
        "timeout has killed it and its process never wrote the result."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    attachment = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="commands",
        help_text="For a command run at the terminal's shell (via `shell`): the terminal "
        "attachment it was reported in. Its argv is the command line as the shell "
        "reported it (empty when the shell kept none), and the recording is the record "
        "of truth.",
    )

    replayed = False
    """True on a record a retry got back instead of a second run (never stored)."""

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="exec_record_idempotency_key_per_user",
            )
        ]
        indexes = [
            models.Index(fields=["session", "-started_at"], name="exec_record_session_newest"),
            models.Index(
                fields=["deadline"],
                condition=models.Q(status="running"),
                name="exec_record_running_deadline",
            ),
        ]

    def __str__(self):
        return f"{' '.join(self.argv)[:60]} ({self.status})"


class TerminalRecording(models.Model):
    """One terminal of a session, from its shell's start to its end, recorded by Quor's
    web tier from what the PTY sent (nothing in the sandbox can turn that off). Its output
    is rows of TerminalOutput while it lasts, written as they come; once it ended, an
    asciicast v2 file in the file store. Kept QUOR_TERMINAL_RECORDING_RETENTION_DAYS."""

    class Status(models.TextChoices):
        RECORDING = "recording", "Recording"
        ENDED = "ended", "Ended"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "quor.Organization", on_delete=models.CASCADE, related_name="terminal_recordings"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="terminal_recordings"
    )
    # Kept when the session is deleted: auditors still read what was done.
    session = models.ForeignKey(
        Session,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="terminal_recordings",
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RECORDING)
    width = models.PositiveSmallIntegerField()
    height = models.PositiveSmallIntegerField()
    size = models.PositiveBigIntegerField(default=0, help_text="Bytes of output recorded.")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=200, blank=True)
    cast = models.ForeignKey(
        "quor.StoredBlob",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        help_text="The asciicast v2 file, once the terminal ended.",
    )

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"],
                condition=models.Q(status="recording"),
                name="terminal_recording_one_open_per_session",
            )
        ]
        indexes = [models.Index(fields=["started_at"], name="terminal_recording_started")]

    def __str__(self):
        return f"Terminal of {self.user} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class TerminalOutput(models.Model):
    """One piece of a recording as the PTY sent it (`o`) or a resize (`r`), `at` seconds
    after the recording started: durable the moment it is shown, whichever web process
    showed it; folded into the asciicast file when the terminal ends."""

    class Kind(models.TextChoices):
        OUTPUT = "o", "Output"
        RESIZE = "r", "Resize"

    recording = models.ForeignKey(
        TerminalRecording, on_delete=models.CASCADE, related_name="outputs"
    )
    at = models.FloatField()
    kind = models.CharField(max_length=1, choices=Kind.choices)
    data = models.TextField()

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.kind} at {self.at:.3f} s"
