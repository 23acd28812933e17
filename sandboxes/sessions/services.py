"""Sessions and their agent: creating them, follow-ups, cancelling, starting turns,
the events the agent reports and the turns it no longer reports on."""

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from apps.catalog import catalog_app
from apps.selectors import apps_for_selection
from quor.filestore import CHUNK_SIZE, blob_chunks, blob_put
from quor.lib import metrics
from quor.lib.errors import Conflict, InvalidInput, NotFound, QuorError
from quor.lib.permissions import check_model_access, check_sandbox_access
from quor.lib.tasks import send, send_on_commit
from quor.models import Organization, User
from sandboxes import image
from sandboxes.backends import get_backend
from sandboxes.backends.base import BackendError
from sandboxes.image import WORKSPACE
from sandboxes.library.managed import sync_managed_area
from sandboxes.models import AgentEvent, Attachment, Sandbox, Session, Skill, hash_token
from sandboxes.runtime import services
from sandboxes.selectors import is_uuid, sessions_of
from sandboxes.sessions.events import (
    newest_turn,
    session_events_append,
    session_progress_append,
    turn_started_at,
)
from sandboxes.signals import session_status_changed

# Kinds the agent runtime may report, and the session status each one leaves behind.
RUNTIME_EVENT_KINDS = {
    "assistant_text_delta": None,
    "assistant_text": None,
    "tool_call": None,
    "tool_result": None,
    "file_changed": None,
    "error": Session.Status.FAILED,
    "turn_finished": Session.Status.WAITING,
}
OPEN_STATUSES = (Session.Status.PENDING, Session.Status.RUNNING)
MAX_EVENTS_PER_REPORT = 1000


class SessionLimitReached(QuorError):
    status = 429
    code = "sessions.organization_limit_reached"


def checked_runtime_events(events) -> list[tuple[str, dict]]:
    """The runtime's events as (kind, payload); InvalidInput for anything else."""
    if not isinstance(events, list) or not events or len(events) > MAX_EVENTS_PER_REPORT:
        raise InvalidInput(
            f"events must be a list of 1 to {MAX_EVENTS_PER_REPORT} events.",
            code="sessions.invalid_events",
        )
    checked = []
    for event in events:
        kind = event.get("kind") if isinstance(event, dict) else None
        payload = event.get("payload", {}) if isinstance(event, dict) else None
        if not isinstance(kind, str) or kind not in RUNTIME_EVENT_KINDS:
            raise InvalidInput(f"Unknown event {kind!r}.", code="sessions.invalid_events")
        if not isinstance(payload, dict):
            raise InvalidInput(f"Unknown event {kind!r}.", code="sessions.invalid_events")
        checked.append((kind, payload))
    return checked


def session_events_report(*, session: Session, events, turn: int | None = None) -> int:
    """Events from the agent runtime: validated, stored, published; returns the last seq.
    An agent that says which turn it works on is refused once that turn has ended (an
    agent without a turn is one started before turns were given to it)."""
    checked = checked_runtime_events(events)
    if session.status == Session.Status.CANCELLED:
        raise Conflict("The session was cancelled.", code="sessions.cancelled")
    if turn is not None and not _turn_is_current(session.pk, turn):
        raise Conflict(TURN_ENDED_MESSAGE, code="sessions.turn_ended")
    outcome = next((RUNTIME_EVENT_KINDS[k] for k, _ in checked if RUNTIME_EVENT_KINDS[k]), None)
    Session.objects.filter(pk=session.pk, status=Session.Status.RUNNING).update(
        agent_seen_at=timezone.now()
    )
    stored = session_events_append(
        session=session, events=checked, status_from=[Session.Status.RUNNING], status_to=outcome
    )
    metrics.events_ingested(kind for kind, _ in checked)
    if outcome:  # the user now reads what the agent did: the idle time starts here
        services.sandbox_touch(session.sandbox_id)
    return stored[-1].seq


def session_progress_report(*, session_id: str, credential: str, report) -> list[dict] | None:
    """A report of a running turn's progress, the runtime's most frequent request, stored
    in two statements (session_progress_append); returns the events to publish. None,
    with nothing stored, for any other report (an outcome, a report without its turn,
    anything malformed, refused or ended): session_events_report answers those."""
    canonical = is_uuid(session_id) and str(uuid.UUID(session_id)) == session_id
    if not canonical or not isinstance(report, dict) or set(report) != {"events", "turn"}:
        return None
    turn = report["turn"]
    if type(turn) is not int or turn < 1:
        return None
    try:
        checked = checked_runtime_events(report["events"])
    except InvalidInput:
        return None
    if any(RUNTIME_EVENT_KINDS[kind] for kind, _ in checked):
        return None
    return session_progress_append(
        session_id=session_id, credential_hash=hash_token(credential), turn=turn, events=checked
    )


def _clean_message(text) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("The message is empty.", code="sessions.empty_message")
    if len(text) > settings.QUOR_MAX_PROMPT_CHARS:
        raise InvalidInput(
            f"The message is longer than {settings.QUOR_MAX_PROMPT_CHARS} characters.",
            code="sessions.message_too_long",
        )
    return text


def _check_organization_limits(user) -> None:
    """Before a turn is opened (a new session, a follow-up), in its transaction: refused
    (429) while the organization has QUOR_ORGANIZATION_MAX_OPEN_SESSIONS sessions with a
    turn pending or running, or its sandbox would be one too many. The organization's
    row stays locked until the commit, so two requests cannot both take the last place
    (FOR NO KEY UPDATE: rows that refer to the organization are still written)."""
    limit = settings.QUOR_ORGANIZATION_MAX_OPEN_SESSIONS
    organization_id = user.membership.organization_id
    if limit:
        Organization.objects.select_for_update(no_key=True).filter(pk=organization_id).first()
        open_sessions = Session.objects.filter(
            owner__membership__organization_id=organization_id, status__in=OPEN_STATUSES
        ).count()
        if open_sessions >= limit:
            raise SessionLimitReached(
                f"Your organization has {open_sessions} sessions with the agent at work, its "
                "limit: try again when one of them has finished."
            )
    services.check_sandbox_capacity(user=user)


def _enqueue_turn(session: Session) -> None:
    """The turn is recorded (pending) either way; if the broker cannot take it now,
    `sessions_requeue_pending` queues it again."""
    send_on_commit("sandboxes.tasks.run_agent_turn", str(session.pk))


def sessions_requeue_pending(*, older_than: float = 60) -> int:
    """Queues again the turns of sessions pending for longer than `older_than` seconds:
    their task was lost (the broker was down, or a crash between the commit and the
    enqueue). A turn starts once, however many tasks ask (run_agent_turn is idempotent)."""
    cutoff = timezone.now() - timedelta(seconds=older_than)
    pending = Session.objects.filter(status=Session.Status.PENDING, updated_at__lte=cutoff)
    ids = [str(pk) for pk in pending.values_list("pk", flat=True)]
    for session_id in ids:
        send("sandboxes.tasks.run_agent_turn", session_id)
    return len(ids)


# While it runs, the agent reports at least every QUOR_AGENT_HEARTBEAT_SECONDS (a
# heartbeat when it has nothing else to say). After QUIET_HEARTBEATS missed beats the
# sandbox is asked whether it still runs; a turn whose sandbox cannot be asked for
# MISSED_HEARTBEATS beats is lost.
QUIET_HEARTBEATS = 2
MISSED_HEARTBEATS = 6
# Starting the agent is one short exec; the turn itself holds no worker.
AGENT_START_TIMEOUT_SECONDS = 30
# Turns started before agents sent heartbeats: past their time limit and this much more,
# nobody runs them.
LOST_TURN_GRACE_SECONDS = 300
# A turn whose sandbox has had no runtime for this long cannot be running either.
LOST_TURN_NO_RUNTIME_SECONDS = 120
LOST_TURN_MESSAGE = (
    "This turn was lost: its agent stopped reporting (its sandbox stopped, or it could "
    "not reach Quor). Send your message again to continue."
)
TIMED_OUT_MESSAGE = "The agent ran past its time limit and was stopped."


TURN_ENDED_MESSAGE = "This turn has ended; its agent must stop."


def _turn_is_current(session_id, turn: int) -> bool:
    """The session is running the turn that began with event `turn`."""
    latest = (
        AgentEvent.objects.filter(session_id=session_id, kind="session_started")
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    running = Session.objects.filter(pk=session_id, status=Session.Status.RUNNING).exists()
    return running and latest == turn


def session_agent_heartbeat(*, session: Session, turn: int | None = None) -> None:
    """The running turn's agent is alive. Refused once its turn has ended (cancelled,
    found lost, or a newer turn began): the agent then stops."""
    current = turn is None or _turn_is_current(session.pk, turn)
    alive = current and Session.objects.filter(pk=session.pk, status=Session.Status.RUNNING).update(
        agent_seen_at=timezone.now()
    )
    if not alive:
        raise Conflict(TURN_ENDED_MESSAGE, code="sessions.turn_ended")


def _agent_state(session: Session) -> tuple[str, str] | None:
    """What the sandbox says of the session's agent: ("running", "") or ("exited",
    "STATUS: last line of its log"); None if the sandbox cannot be asked."""
    sandbox = session.sandbox
    argv = image.agent_state_argv(str(session.pk), services.session_workspace(session))
    try:
        result = get_backend(sandbox.backend).exec(
            sandbox.backend_sandbox_id, argv, cwd=WORKSPACE, env={}, timeout_s=30, output_limit=8192
        )
    except BackendError:
        return None
    first, _, log = result.stdout.decode(errors="replace").partition("\n")
    if first == "running":
        return "running", ""
    if first.startswith("exited "):
        last = (log.strip().splitlines() or ["no output"])[-1][-300:]
        return "exited", f"{first.removeprefix('exited ')}: {last}"
    return None


def _silent_agent_outcome(session: Session, now) -> tuple[str, str] | None:
    """An agent that missed heartbeats: still running (Quor was out of its reach) counts
    as seen now; one that ended without ending its turn crashed; a sandbox that cannot
    be asked for six beats has lost it."""
    state = _agent_state(session)
    if state is not None and state[0] == "running":
        Session.objects.filter(pk=session.pk, status=Session.Status.RUNNING).update(
            agent_seen_at=now
        )
        return None
    if state is not None:
        return "agent.crashed", f"The agent stopped unexpectedly (exit status {state[1]})"
    beats = timedelta(seconds=MISSED_HEARTBEATS * settings.QUOR_AGENT_HEARTBEAT_SECONDS)
    if session.agent_seen_at < now - beats:
        return "agent.lost", LOST_TURN_MESSAGE
    return None


def _turn_outcome_if_over(session: Session, turn: AgentEvent, now) -> tuple[str, str] | None:
    """Why a running turn is over though its agent never said so, if it is."""
    no_runtime_since = now - timedelta(seconds=LOST_TURN_NO_RUNTIME_SECONDS)
    without_runtime = (Sandbox.State.ABSENT, Sandbox.State.FAILED, Sandbox.State.STOPPED,
                       Sandbox.State.SLEEPING)  # fmt: skip
    if (
        session.sandbox.state in without_runtime
        and turn.created_at < no_runtime_since
        and session.sandbox.updated_at < no_runtime_since
    ):
        return "agent.lost", LOST_TURN_MESSAGE
    time_limit = timedelta(seconds=settings.QUOR_AGENT_TURN_TIMEOUT)
    if session.agent_seen_at is None:  # not started yet, or started before heartbeats
        if turn.created_at < now - time_limit - timedelta(seconds=LOST_TURN_GRACE_SECONDS):
            return "agent.lost", LOST_TURN_MESSAGE
        return None
    if turn.created_at < now - time_limit:
        return "agent.timeout", TIMED_OUT_MESSAGE
    quiet = timedelta(seconds=QUIET_HEARTBEATS * settings.QUOR_AGENT_HEARTBEAT_SECONDS)
    if session.agent_seen_at < now - quiet:
        return _silent_agent_outcome(session, now)
    return None


def sessions_fail_lost_turns() -> int:
    """Ends the turns no agent will end: its agent crashed, its runtime died (the
    sandbox was stopped, the host restarted), or it ran past its time limit. A session
    left `running` would also keep its sandbox from ever going to sleep. An agent that
    may still run is stopped first, while its turn is still the session's newest: a
    follow-up's agent can never be the one stopped."""
    now = timezone.now()
    ended = 0
    for session in Session.objects.filter(status=Session.Status.RUNNING).select_related("sandbox"):
        turn = newest_turn(session)
        outcome = turn and _turn_outcome_if_over(session, turn, now)
        if not outcome:
            continue
        if outcome[0] != "agent.crashed":
            services.stop_agent_process(session=session)
        ended += _fail(session, turn.seq, *outcome)
    return ended


def _check_attachments(attachments) -> None:
    if len(attachments) > settings.QUOR_MAX_ATTACHMENTS:
        raise InvalidInput(
            f"At most {settings.QUOR_MAX_ATTACHMENTS} files can be attached.",
            code="sessions.too_many_attachments",
        )
    for upload in attachments:
        if upload.size > settings.QUOR_MAX_ATTACHMENT_BYTES:
            raise InvalidInput(
                f"{upload.name} is larger than {settings.QUOR_MAX_ATTACHMENT_BYTES} bytes.",
                code="sessions.attachment_too_large",
            )
        if not upload.name or "/" in upload.name or upload.name in (".", ".."):
            raise InvalidInput(
                f"{upload.name!r} is not a file name.", code="sessions.bad_attachment"
            )


def _store_attachments(session: Session, attachments) -> None:
    for upload in attachments:
        blob = blob_put(upload.chunks(chunk_size=CHUNK_SIZE))
        Attachment.objects.create(session=session, name=upload.name, blob=blob)


def session_attachments_copy(*, session: Session) -> None:
    """Copies the session's attachments from the file store (checked) into its
    `attachments/` directory: by the session's first turn, before its agent starts, and
    again on demand. Not while the session is created: a wake inside that transaction
    would release the sandbox's lock before the commit, and another worker, still
    seeing it asleep, would wake it again."""
    for attachment in session.attachments.select_related("blob"):
        services.session_file_write(
            session=session,
            path=f"attachments/{attachment.name}",
            chunks=blob_chunks(attachment.blob),
            size=attachment.blob.size,
        )


TITLE_MAX_CHARS = 200  # Session.title's max_length
# A title taken from the prompt is at most this long: it names the session in lists and
# in the browser's tab, where a long prompt's first line would run over several lines.
TITLE_FROM_PROMPT_CHARS = 80


def title_from_prompt(prompt: str) -> str:
    """The prompt's first line, shortened at a word boundary with an ellipsis."""
    line = " ".join(prompt.strip().splitlines()[0].split())
    if len(line) <= TITLE_FROM_PROMPT_CHARS:
        return line
    cut = line[: TITLE_FROM_PROMPT_CHARS - 1]
    if " " in cut[TITLE_FROM_PROMPT_CHARS // 2 :]:  # a word ends late enough to cut there
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,.;:-") + "…"


@transaction.atomic
def session_create(
    *, user, prompt, model: str, title: str = "", attachments=(), skills=(), apps=()
) -> Session:
    """A new session; the agent starts working on the prompt in the background.
    Attached files are kept in the file store and copied into the session's workspace
    first."""
    check_sandbox_access(user)
    choice = check_model_access(user, model)
    prompt = _clean_message(prompt)
    _check_attachments(attachments)
    organization = user.membership.organization
    unknown = set(skills) - set(
        Skill.objects.filter(organization=organization).values_list("name", flat=True)
    )
    if unknown:
        raise InvalidInput(
            f"Unknown Skills: {', '.join(sorted(unknown))}.", code="sessions.unknown_skill"
        )
    selected_apps = apps_for_selection(organization, apps)
    _check_organization_limits(user)
    sandbox = services.get_or_create_sandbox(user=user)
    services.check_workspace_restorable(sandbox)
    session = Session.objects.create(
        skills=sorted(set(skills)),
        owner=user,
        sandbox=sandbox,
        title=title.strip()[:TITLE_MAX_CHARS] or title_from_prompt(prompt),
        model_provider=choice.provider,
        model_name=choice.name,
    )
    session.apps.set(selected_apps)
    if attachments:  # copied into the workspace by the first turn, outside this transaction
        _store_attachments(session, attachments)
    names = [upload.name for upload in attachments]
    session_events_append(
        session=session, events=[("user_message", {"text": prompt, "attachments": names})]
    )
    _enqueue_turn(session)
    return session


@transaction.atomic
def session_message(*, user, session: Session, text) -> Session:
    """A follow-up: the agent continues the same conversation."""
    check_sandbox_access(user)
    text = _clean_message(text)
    session = Session.objects.select_for_update().get(pk=session.pk)
    services.check_workspace_restorable(session.sandbox)
    if session.status in OPEN_STATUSES:
        raise Conflict("The agent is still working on this session.", code="sessions.busy")
    _check_organization_limits(user)
    Session.objects.filter(pk=session.pk).update(
        status=Session.Status.PENDING, finished_at=None, updated_at=timezone.now()
    )
    session_events_append(session=session, events=[("user_message", {"text": text})])
    _enqueue_turn(session)
    session.refresh_from_db()
    return session


def session_cancel(*, user, session: Session, reason: str = "") -> Session:
    """Stops the agent (it gets SIGTERM in the sandbox) and records that it was cancelled
    (and why, when it was not the user's choice). The agent is stopped first, while its
    turn is the session's newest: a follow-up's agent can never be the one stopped. One
    that starts in between is refused at its first heartbeat and stops itself."""
    not_running = Conflict("The session is not running.", code="sessions.not_running")
    if session.status not in OPEN_STATUSES:
        raise not_running
    services.stop_agent_process(session=session)
    with transaction.atomic():
        updated = Session.objects.filter(pk=session.pk, status__in=OPEN_STATUSES).update(
            status=Session.Status.CANCELLED, finished_at=timezone.now(), updated_at=timezone.now()
        )
        if not updated:
            raise not_running
        if session.status == Session.Status.RUNNING:
            metrics.turn_ended(Session.Status.CANCELLED, turn_started_at(session))
        cancelled = {"by": user.email} | ({"reason": reason} if reason else {})
        session_events_append(session=session, events=[("cancelled", cancelled)])
        session_status_changed.send(Session, session=session, status=Session.Status.CANCELLED)
    session.refresh_from_db()
    return session


def sessions_end_for_deactivated_user(*, user_id) -> None:
    """A deactivated user's running turns are cancelled and their sandbox put to sleep,
    its snapshot kept per retention. Safe to run twice; nothing is done for a user let
    in again meanwhile."""
    user = User.objects.filter(pk=user_id, is_active=False).first()
    if user is None:
        return
    for session in Session.objects.filter(owner=user, status__in=OPEN_STATUSES):
        try:
            session_cancel(user=user, session=session, reason="deactivated")
        except Conflict:
            continue  # the turn ended meanwhile
    sandbox = Sandbox.objects.filter(user=user).first()
    if sandbox is not None:
        services.sandbox_sleep(sandbox=sandbox, force=True)


def session_rename(*, user, session: Session, title) -> Session:
    """A new title, chosen by the session's owner."""
    if session.owner_id != user.pk:
        raise NotFound("No such session.")
    title = title.strip() if isinstance(title, str) else ""
    if not title or len(title) > TITLE_MAX_CHARS:
        raise InvalidInput(
            f"A title has 1 to {TITLE_MAX_CHARS} characters.", code="sessions.invalid_title"
        )
    Session.objects.filter(pk=session.pk).update(title=title, updated_at=timezone.now())
    session.refresh_from_db()
    return session


def session_delete(*, user, session: Session) -> None:
    """Deletes the session with its conversation, attachments (their stored files are
    collected with the store's other garbage), approvals and web apps (their addresses
    stop answering at once). Refused while the agent works: stop it first. The session's
    directory in the sandbox is left as it is (docs/decisions.md, 2026-12-01)."""
    if session.owner_id != user.pk:
        raise NotFound("No such session.")
    with transaction.atomic():
        locked = Session.objects.select_for_update().filter(pk=session.pk).first()
        if locked is None:
            return
        if locked.status in OPEN_STATUSES:
            raise Conflict(
                "The agent is still working on this session; stop it before deleting it.",
                code="sessions.busy",
            )
        locked.delete()


def sessions_matching(user, query: str):
    """The user's sessions whose title or one of whose messages contains `query`
    (any case); all of them for an empty query."""
    found = sessions_of(user)
    query = query.strip()
    if not query:
        return found
    messages = AgentEvent.objects.filter(
        session=OuterRef("pk"), kind="user_message", payload__text__icontains=query
    )
    return found.filter(Q(title__icontains=query) | Exists(messages))


def agents_md(session: Session) -> str:
    """The session's agent instructions: the organization's, the chosen Skills, and
    where attachments and the library are."""
    organization = session.owner.membership.organization
    parts = ["# Instructions for this session", ""]
    if organization.workspace_instructions.strip():
        parts += [organization.workspace_instructions.strip(), ""]
    skills = Skill.objects.filter(organization=organization, name__in=session.skills)
    if skills:
        parts += ["## Skills", "", "Read a Skill's SKILL.md before using it:", ""]
        parts += [f"- `skills/{skill.name}/`: {skill.description}" for skill in skills]
        parts += [""]
    parts += [
        "Files attached to this session are in `attachments/`; the user's library is in",
        "`library/` (shared by all their sessions).",
        "",
        "You work in this directory; it is this session's own workspace.",
        "Every network request goes through Quor's egress proxy. Credentials are never in",
        "this sandbox: use the placeholders in the environment and the proxy adds the real",
        "ones. A 403 with a JSON `error.code` from the proxy means the request is not allowed;",
        "report it rather than working around it.",
        "",
        "## Web apps",
        "",
        "To show the user a web app you built, start its server with the `start_web_app`",
        "tool (a command and a port), not with run_command. The server must listen on",
        "0.0.0.0, not 127.0.0.1 or localhost. The user then sees a live preview of it in this",
        "session and can open it in a tab; it keeps running after your turn.",
    ]
    apps = list(session.apps.all())
    if apps:
        parts += [
            "",
            "## Apps",
            "",
            "These Apps are enabled for this session. Call their APIs directly (curl, an SDK):",
            "the proxy adds the credential, so send no token, or the placeholder from",
            "`$QUOR_CREDENTIAL_PLACEHOLDER` where a tool insists on one. Some actions wait",
            "for the user's approval (the request stays open until they answer); a 403",
            "`approvals.rejected` or `apps.action_denied` is final: do not retry it.",
            "",
        ]
        parts += [f"- {app.name}: {', '.join(app.url_patterns)}" for app in apps]
    return "\n".join(parts) + "\n"


def app_token_placeholders(session: Session) -> dict[str, str]:
    """The variables tools read a token from (GH_TOKEN, ...), for the session's built-in
    Apps: they hold the placeholder, which the proxy replaces with the credential."""
    keys = {app.catalog_key for app in session.apps.all() if app.catalog_key}
    entries = [catalog_app(key) for key in sorted(keys)]
    return {entry.agent_env: session.sandbox.placeholder for entry in entries if entry}


def _latest_user_message(session: Session) -> str:
    event = session.events.filter(kind="user_message").order_by("-seq").first()
    return event.payload["text"]


def _end_turn(session: Session, turn_started_seq: int, status, events=()) -> bool:
    """Ends this turn, unless the runtime already did or a newer turn has started (a
    follow-up may start the next turn before the one who ends this one acts). True if
    it did."""
    with transaction.atomic():
        current = Session.objects.select_for_update().get(pk=session.pk)
        newer = session.events.filter(kind="session_started", seq__gt=turn_started_seq)
        if current.status != Session.Status.RUNNING or newer.exists():
            return False
        session_events_append(
            session=session, events=list(events),
            status_from=[Session.Status.RUNNING], status_to=status,
        )  # fmt: skip
    return True


def _fail(session: Session, turn_started_seq: int, code: str, message: str) -> bool:
    ended = _end_turn(
        session, turn_started_seq, Session.Status.FAILED,
        [("error", {"code": code, "message": message})],
    )  # fmt: skip
    if ended:
        metrics.TURN_FAILURES.labels(code).inc()
    return ended


def _agent_may_start(session: Session, turn: int) -> bool:
    """The turn is still the session's running one (not cancelled or ended while its
    workspace was prepared); from now on its agent's silence counts."""
    with transaction.atomic():
        Session.objects.select_for_update().filter(pk=session.pk).first()
        if not _turn_is_current(session.pk, turn):
            return False
        Session.objects.filter(pk=session.pk).update(agent_seen_at=timezone.now())
    return True


def session_run_turn(*, session_id) -> None:
    """Starts the agent on the session's newest message, in the user's sandbox, as the
    sandbox user, and returns: the agent ends the turn with its own events, and
    `sessions_fail_lost_turns` ends a turn whose agent stopped reporting. No worker waits
    for a turn. Idempotent: only a pending session starts a turn."""
    session = Session.objects.select_related("sandbox", "model_provider", "owner").get(
        pk=session_id
    )
    provider = session.model_provider
    started_payload = {"model": session.model_name, "provider": provider.display_name}
    with transaction.atomic():  # the turn starts with its event, or not at all
        started = Session.objects.filter(pk=session.pk, status=Session.Status.PENDING).update(
            status=Session.Status.RUNNING, updated_at=timezone.now(), agent_seen_at=None
        )
        if not started:
            return
        [started_event] = session_events_append(
            session=session, events=[("session_started", started_payload)]
        )
    turn = started_event.seq
    try:
        workspace = services.session_workspace_ensure(session=session)
        if not session.events.filter(kind="session_started", seq__lt=turn).exists():
            session_attachments_copy(session=session)
        sync_managed_area(session=session)
        backend, sandbox_id = (
            get_backend(session.sandbox.backend),
            session.sandbox.backend_sandbox_id,
        )
        for name, content in (
            (image.NEXT_MESSAGE, _latest_user_message(session)),
            ("AGENTS.md", agents_md(session)),
        ):
            data = content.encode()
            backend.write_file(sandbox_id, workspace, name, [data], len(data))
        if not _agent_may_start(session, turn):
            return
        launch = backend.exec(
            sandbox_id,
            image.start_agent_argv(
                str(session.pk), workspace, turn, time_limit_s=settings.QUOR_AGENT_TURN_TIMEOUT
            ),
            cwd=workspace,
            env={
                **services.sandbox_identity_environment(session.sandbox, session=session),
                "QUOR_MODEL_KIND": provider.kind,
                "QUOR_MODEL_BASE_URL": provider.effective_base_url,
                "QUOR_MODEL_NAME": session.model_name,
                "QUOR_MAX_STEPS": str(settings.QUOR_AGENT_MAX_STEPS),
                "QUOR_HEARTBEAT_INTERVAL": str(settings.QUOR_AGENT_HEARTBEAT_SECONDS),
                **app_token_placeholders(session),
                # A command may wait for the user's approval of one of its requests.
                "QUOR_COMMAND_TIMEOUT": str(max(120, settings.QUOR_APPROVAL_TIMEOUT_SECONDS + 60)),
            },
            timeout_s=AGENT_START_TIMEOUT_SECONDS,
            output_limit=64 * 1024,
        )
    except (services.WorkspaceUnrestorable, services.SandboxLimitReached) as exc:
        _fail(session, turn, exc.code, exc.message)
        return
    except (QuorError, BackendError) as exc:
        _fail(
            session,
            turn,
            "agent.sandbox_unavailable",
            f"The sandbox could not run the agent: {exc}",
        )
        return
    if launch.exit_code != 0:
        detail = launch.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        _fail(session, turn, "agent.crashed", f"The agent could not be started: {detail[0]}")
