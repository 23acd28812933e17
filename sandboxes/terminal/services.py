"""The session's interactive terminal: a shell on a PTY in the sandbox, as the sandbox
user with the session's proxy identity, shown over a WebSocket and recorded.

The shell lives in a tmux server of the session's own in the sandbox (sandboxes/image.py),
so it outlives the WebSocket that showed it: each connection, on whichever web process,
attaches to it. The web tier records what the PTY sends as it shows it (rows of
TerminalOutput, durable at once), so nothing in the sandbox can turn the recording off;
when the shell ends (`exit`, a cancel of the session's turn, the sandbox's sleep or stop)
the rows become an asciicast v2 file in the file store. Each attachment is a record of
the exec journal (via `terminal`), finished when it ends; each command the shell reports
running (sandboxes/terminal/markers.py) is a record of its own (via `shell`), linked to
the attachment's.
"""

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from quor.filestore import blob_put
from quor.lib.errors import InvalidInput, NotFound
from quor.lib.permissions import check_sandbox_access
from sandboxes import image
from sandboxes.backends import get_backend
from sandboxes.backends.base import BackendError, ExecResult, RuntimeMissing, Terminal
from sandboxes.image import WORKSPACE
from sandboxes.models import ExecRecord, Sandbox, Session, TerminalOutput, TerminalRecording
from sandboxes.runtime import journal, services
from sandboxes.terminal import markers

logger = logging.getLogger(__name__)

MAX_COLS = 500
MAX_ROWS = 200
# What the shell runs with besides the session's identity: its shell integration reports
# each command it runs (sandboxes/terminal/markers.py).
TERMINAL_ENV = {"TERM": "xterm-256color", "SHELL": "/bin/bash", **markers.SHELL_ENV}
# The most commands the shell's markers journal per attachment, and the most shells
# (nested ones) with a command running at once: a program in the sandbox that forges
# markers cannot flood the journal.
MAX_COMMANDS_PER_ATTACHMENT = 1000
MAX_OPEN_COMMANDS = 8
NO_END_REPORTED = (
    "The attachment ended before the shell reported this command's end: it may still "
    "run, or the shell that ran it is gone. The recording shows what happened."
)
SUPERSEDED = "The same shell reported another command before this one's end."
# The journal's deadline of an attachment: the consumer ends one that lasts longer (the
# browser attaches again at once), so that a record still running past it is one whose
# web process died.
ATTACHMENT_MAX_S = 8 * 3600

ENDED_BY_SHELL = "The shell ended."
ENDED_BY_SANDBOX = "The sandbox went to sleep or stopped."
ENDED_BY_CANCEL = "The session's turn was cancelled."
ENDED_BY_SIZE = "The recording reached its size limit."


def clean_terminal_size(cols, rows) -> tuple[int, int]:
    """Columns and rows as whole numbers within bounds; a 400 otherwise."""
    try:
        cols, rows = int(cols), int(rows)
    except (TypeError, ValueError):
        cols = rows = 0
    if not (1 <= cols <= MAX_COLS and 1 <= rows <= MAX_ROWS):
        raise InvalidInput(
            f"A terminal is 1 to {MAX_COLS} columns by 1 to {MAX_ROWS} rows.",
            code="terminal.invalid_size",
        )
    return cols, rows


@dataclass
class TerminalAttachment:
    """One WebSocket's view of the session's shell: the PTY, the recording it adds to,
    and its exec journal record."""

    session_id: str
    sandbox_id: str
    recording_id: str
    recording_started: float  # epoch seconds: asciicast times count from here
    recorded: int  # bytes of output in the recording so far
    record: ExecRecord
    terminal: Terminal
    attached_at: float
    # The commands the shell reported running and not ended yet, by shell pid, and how
    # many were journaled (at most MAX_COMMANDS_PER_ATTACHMENT).
    commands: dict[str, ExecRecord] = field(default_factory=dict)
    commands_journaled: int = 0
    detached: bool = False


def terminal_attach(*, user, session: Session, cols: int, rows: int) -> TerminalAttachment:
    """Attaches to the session's shell (starting the sandbox, and the shell, if needed).
    Only the session's owner, who may use a sandbox, ever gets here."""
    if session.owner_id != user.pk:
        raise NotFound("No such session.")
    membership = check_sandbox_access(user)
    path = services.session_workspace_ensure(session=session)
    sandbox = Sandbox.objects.get(pk=session.sandbox_id)
    backend = get_backend(sandbox.backend)
    try:
        alive = _shell_lives(backend, sandbox, session)
    except BackendError as exc:
        raise services.SandboxUnavailable(f"The terminal could not start: {exc}") from exc
    recording = _recording_to_add_to(
        session, membership.organization, alive=alive, cols=cols, rows=rows
    )
    argv = image.terminal_attach_argv(str(session.pk), path)
    env = {**services.sandbox_identity_environment(sandbox, session=session), **TERMINAL_ENV}
    request = services.ExecRequest(argv=argv, cwd=path, env=env, timeout_s=ATTACHMENT_MAX_S)
    record = journal.exec_begin(
        user=user,
        organization=membership.organization,
        session=session,
        request=request,
        idempotency_key="",
        via=ExecRecord.Via.TERMINAL,
    )
    try:
        terminal = backend.open_terminal(
            sandbox.backend_sandbox_id, argv, cwd=path, env=env, cols=cols, rows=rows
        )
    except BackendError as exc:
        journal.exec_not_started(record, str(exc))
        services.sandbox_refresh_state(sandbox)
        raise services.SandboxUnavailable(f"The terminal could not start: {exc}") from exc
    services.sandbox_touch(sandbox.pk)
    Sandbox.objects.filter(pk=sandbox.pk).update(**services.IN_USE)
    attachment = TerminalAttachment(
        session_id=str(session.pk),
        sandbox_id=str(sandbox.pk),
        recording_id=str(recording.pk),
        recording_started=recording.started_at.timestamp(),
        recorded=recording.size,
        record=record,
        terminal=terminal,
        attached_at=time.monotonic(),
    )
    if (cols, rows) != (recording.width, recording.height):
        terminal_resize(attachment, cols=cols, rows=rows)
    return attachment


def _shell_lives(backend, sandbox: Sandbox, session: Session) -> bool:
    """Raises BackendError when the runtime cannot be asked (Docker is down)."""
    try:
        result = backend.exec(
            sandbox.backend_sandbox_id,
            image.terminal_exists_argv(str(session.pk)),
            cwd=WORKSPACE,
            env={},
            timeout_s=10,
            output_limit=4096,
        )
    except RuntimeMissing:
        return False
    return result.exit_code == 0


def _recording_to_add_to(
    session: Session, organization, *, alive: bool, cols: int, rows: int
) -> TerminalRecording:
    """The session's open recording while its shell lives; else a new one (an open one
    whose shell is gone is finished first)."""
    current = TerminalRecording.objects.filter(
        session=session, status=TerminalRecording.Status.RECORDING
    ).first()
    if current is not None and alive:
        return current
    if current is not None:
        terminal_recording_finish(recording_id=current.pk, reason=ENDED_BY_SHELL)
    try:
        with transaction.atomic():
            return TerminalRecording.objects.create(
                organization=organization,
                user=session.owner,
                session=session,
                width=cols,
                height=rows,
                started_at=timezone.now(),
            )
    except IntegrityError:  # another connection started it at the same moment
        return TerminalRecording.objects.get(
            session=session, status=TerminalRecording.Status.RECORDING
        )


def terminal_output_record(attachment: TerminalAttachment, text: str) -> int:
    """Stores what the PTY sent (already shown); returns the recording's size since this
    attachment began, which the caller holds to QUOR_TERMINAL_RECORDING_MAX_BYTES."""
    _record(attachment, TerminalOutput.Kind.OUTPUT, text)
    attachment.recorded += len(text.encode())
    return attachment.recorded


def _record(attachment: TerminalAttachment, kind: str, data: str) -> None:
    at = max(0.0, time.time() - attachment.recording_started)
    TerminalOutput.objects.create(
        recording_id=attachment.recording_id, at=round(at, 6), kind=kind, data=data
    )
    if kind == TerminalOutput.Kind.OUTPUT:
        TerminalRecording.objects.filter(pk=attachment.recording_id).update(
            size=F("size") + len(data.encode())
        )


def terminal_commands_record(
    attachment: TerminalAttachment, events: list[markers.CommandStarted | markers.CommandEnded]
) -> None:
    """Journals what the shell's markers reported: a started command is a record (via
    `shell`), an ended one gets its exit status. The shell's word, bounded: a marker's
    content by markers.py, the records by MAX_COMMANDS_PER_ATTACHMENT."""
    for event in events:
        if attachment.detached:
            return
        if isinstance(event, markers.CommandEnded):
            record = attachment.commands.pop(event.shell_pid, None)
            if record is not None:
                duration = (timezone.now() - record.started_at).total_seconds()
                _journal_finished(record, exit_code=event.exit_code, duration_s=duration)
            continue
        if (earlier := attachment.commands.pop(event.shell_pid, None)) is not None:
            journal.exec_interrupted(earlier, SUPERSEDED)
        if attachment.commands_journaled >= MAX_COMMANDS_PER_ATTACHMENT:
            if attachment.commands_journaled == MAX_COMMANDS_PER_ATTACHMENT:
                logger.warning(
                    "terminal attachment %s reached %d commands: no more are journaled",
                    attachment.record.pk,
                    MAX_COMMANDS_PER_ATTACHMENT,
                )
                attachment.commands_journaled += 1
            continue
        if len(attachment.commands) >= MAX_OPEN_COMMANDS:
            continue
        attachment.commands_journaled += 1
        attachment.commands[event.shell_pid] = journal.exec_shell_command_begin(
            attachment=attachment.record,
            argv=[] if event.line is None else [event.line],
            cwd=event.cwd,
        )


def _journal_finished(record: ExecRecord, *, exit_code: int, duration_s: float) -> None:
    """The terminal's records keep no output: the recording has it."""
    journal.exec_finished(
        record,
        ExecResult(
            exit_code=exit_code,
            stdout=b"",
            stderr=b"",
            stdout_truncated=False,
            stderr_truncated=False,
            timed_out=False,
            duration_s=round(duration_s, 3),
        ),
    )


def terminal_resize(attachment: TerminalAttachment, *, cols: int, rows: int) -> None:
    cols, rows = clean_terminal_size(cols, rows)
    attachment.terminal.resize(cols, rows)
    _record(attachment, TerminalOutput.Kind.RESIZE, f"{cols}x{rows}")


def terminal_input(attachment: TerminalAttachment, data: bytes) -> None:
    """What was typed goes to the shell (not into the recording: the shell's echo is
    there, and a password typed at a prompt that does not echo stays out of it)."""
    attachment.terminal.write(data)


def terminal_detach(attachment: TerminalAttachment) -> str:
    """Ends this attachment (its PTY's client, never the shell) and, when the shell is
    gone, the recording; then finishes its journal record (so a finished record means
    all of this is done). Returns why the shell ended, "" while it lives."""
    attachment.detached = True
    attachment.terminal.close()
    while attachment.commands:
        journal.exec_interrupted(attachment.commands.popitem()[1], NO_END_REPORTED)
    exit_code = attachment.terminal.exit_code()
    reason = _why_the_shell_ended(attachment)
    if reason:
        terminal_recording_finish(recording_id=attachment.recording_id, reason=reason)
        stored = TerminalRecording.objects.filter(pk=attachment.recording_id)
        reason = stored.values_list("end_reason", flat=True).first() or reason
    _journal_finished(
        attachment.record,
        exit_code=-1 if exit_code is None else exit_code,
        duration_s=time.monotonic() - attachment.attached_at,
    )
    return reason


def _why_the_shell_ended(attachment: TerminalAttachment) -> str:
    session = Session.objects.select_related("sandbox").filter(pk=attachment.session_id).first()
    sandbox = session.sandbox if session else None
    if sandbox is None or sandbox.state != Sandbox.State.RUNNING:
        return ENDED_BY_SANDBOX
    try:
        if _shell_lives(get_backend(sandbox.backend), sandbox, session):
            return ""
    except BackendError:
        return ""  # unknown: the beat task finishes the recording if the runtime is gone
    return ENDED_BY_SHELL


def terminal_end(*, session_id, reason: str) -> None:
    """Ends the session's shell, for `reason`: the recording keeps it (whoever finishes
    it), each open WebSocket is told it, then the tmux server is killed, so every
    attachment's PTY ends; the recording is finished."""
    session = Session.objects.select_related("sandbox").get(pk=session_id)
    recordings = TerminalRecording.objects.filter(
        session=session, status=TerminalRecording.Status.RECORDING
    )
    recordings.filter(end_reason="").update(end_reason=reason[:200])
    _tell_viewers_it_ended(session.pk, reason)
    sandbox = session.sandbox
    if sandbox.state in services.RUNTIME_STATES:
        try:
            get_backend(sandbox.backend).exec(
                sandbox.backend_sandbox_id,
                image.terminal_end_argv(str(session.pk)),
                cwd=WORKSPACE,
                env={},
                timeout_s=10,
                output_limit=4096,
            )
        except BackendError as exc:  # the runtime is gone: so is the shell
            logger.info("the terminal of session %s was not there to end: %s", session.pk, exc)
    for recording_id in recordings.values_list("pk", flat=True):
        terminal_recording_finish(recording_id=recording_id, reason=reason)


def terminal_group(session_id) -> str:
    """Every WebSocket showing the session's terminal."""
    return f"terminal-{session_id}"


def _tell_viewers_it_ended(session_id, reason: str) -> None:
    async_to_sync(get_channel_layer().group_send)(
        terminal_group(session_id), {"type": "terminal.ended", "reason": reason}
    )


def terminal_recording_finish(*, recording_id, reason: str) -> TerminalRecording | None:
    """Writes the recording's asciicast file to the file store and marks it ended; its
    output rows go. Safe to call twice, from any process: the first one does it. A
    reason set before (terminal_end's) wins over `reason`."""
    with transaction.atomic():
        recording = (
            TerminalRecording.objects.select_for_update()
            .filter(pk=recording_id, status=TerminalRecording.Status.RECORDING)
            .first()
        )
        if recording is None:
            return None
        recording.cast = blob_put(asciicast_lines(recording))
        recording.status = TerminalRecording.Status.ENDED
        recording.ended_at = timezone.now()
        recording.end_reason = recording.end_reason or reason[:200]
        recording.save(update_fields=["cast", "status", "ended_at", "end_reason"])
        recording.outputs.all().delete()
    return recording


def asciicast_lines(recording: TerminalRecording) -> Iterator[bytes]:
    """asciicast v2: a header line, then one JSON array per event, `[time, code, data]`
    (https://docs.asciinema.org/manual/asciicast/v2/)."""
    header = {
        "version": 2,
        "width": recording.width,
        "height": recording.height,
        "timestamp": int(recording.started_at.timestamp()),
        "env": {"TERM": TERMINAL_ENV["TERM"], "SHELL": TERMINAL_ENV["SHELL"]},
        "title": f"Terminal of session {recording.session_id}",
    }
    yield (json.dumps(header) + "\n").encode()
    outputs = recording.outputs.order_by("id").values_list("at", "kind", "data")
    previous = 0.0
    for at, kind, data in outputs.iterator(chunk_size=500):
        # In the order shown; a resize's time, taken in another thread, may be a few ms
        # behind the output before it, and asciicast times never go back.
        previous = max(previous, at)
        yield (json.dumps([previous, kind, data], ensure_ascii=False) + "\n").encode()


def terminal_recordings_finish_stale() -> int:
    """Finishes open recordings whose shell cannot live any more (their sandbox has no
    runtime, or their session was deleted) and nobody is left to notice: the browser
    that showed them went away first. Returns how many."""
    stale = TerminalRecording.objects.filter(status=TerminalRecording.Status.RECORDING).exclude(
        session__sandbox__state__in=services.RUNTIME_STATES
    )
    finished = [
        terminal_recording_finish(recording_id=recording_id, reason=ENDED_BY_SANDBOX)
        for recording_id in stale.values_list("pk", flat=True)
    ]
    return sum(1 for recording in finished if recording is not None)


def terminal_recordings_delete_old() -> int:
    """Recordings that ended more than QUOR_TERMINAL_RECORDING_RETENTION_DAYS ago, with
    their files (sandboxes/receivers.py deletes a deleted row's blob)."""
    cutoff = timezone.now() - timedelta(days=settings.QUOR_TERMINAL_RECORDING_RETENTION_DAYS)
    deleted = 0
    for recording in TerminalRecording.objects.filter(
        status=TerminalRecording.Status.ENDED, ended_at__lt=cutoff
    ):
        recording.delete()
        deleted += 1
    return deleted
