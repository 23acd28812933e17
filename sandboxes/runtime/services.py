"""Sandbox lifecycle, commands and files. Every entry point (API, tasks, commands)
calls these functions.

Each state change is written to PostgreSQL before its side effect, and work on one
sandbox is serialised by a PostgreSQL advisory lock: two requests at the same moment
produce one container, and a crashed worker releases the lock with its connection.
"""

import contextlib
import logging
import posixpath
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from egress.decisions import SANDBOX_PRINCIPAL, SESSION_PRINCIPAL_PREFIX
from quor.audit import audit_record, organization_of
from quor.lib import metrics
from quor.lib.errors import (
    CorruptBlob,
    FileStoreMisconfigured,
    FileStoreUnavailable,
    InvalidInput,
    QuorError,
)
from quor.lib.locks import advisory_lock, advisory_try_lock
from quor.lib.permissions import check_sandbox_access
from quor.lib.tasks import send_on_commit
from quor.models import Membership, User
from sandboxes import image
from sandboxes.backends import get_backend
from sandboxes.backends.base import (
    BackendError,
    BackendUnavailable,
    ExecResult,
    FileRefused,
    RuntimeMissing,
)
from sandboxes.backends.execution import with_timeout
from sandboxes.image import SESSIONS_DIR, WORKSPACE
from sandboxes.models import (
    ExecRecord,
    PooledRuntime,
    Sandbox,
    Session,
    Snapshot,
    WorkspaceReset,
    hash_token,
    new_secret_token,
)
from sandboxes.runtime import journal
from sandboxes.runtime.pool import pool_take, runtime_spec
from sandboxes.runtime.snapshots import (
    SnapshotDamaged,
    good_snapshots,
    snapshot_mark_damaged,
    snapshot_restore,
    snapshot_take,
    snapshots_delete,
    snapshots_prune,
)
from sandboxes.selectors import get_session_for_user, is_uuid
from sandboxes.signals import runtime_ready

logger = logging.getLogger(__name__)


class SandboxUnavailable(QuorError):
    status = 503
    code = "sandboxes.unavailable"
    default_message = "The sandbox could not be started."


class SandboxLimitReached(SandboxUnavailable):
    """A SandboxUnavailable, so that whatever copes with a sandbox that cannot start
    copes with this one too; 429: it may start once others have gone to sleep."""

    status = 429
    code = "sandboxes.organization_limit_reached"


class WorkspaceUnrestorable(QuorError):
    status = 409
    code = "sandboxes.workspace_unrestorable"
    default_message = (
        "Your workspace could not be restored. You can start again with an empty workspace."
    )


class WorkspaceNotLost(QuorError):
    status = 409
    code = "sandboxes.workspace_not_lost"
    default_message = "The workspace is not lost, so it is not replaced."


class SnapshotFailed(QuorError):
    status = 503
    code = "sandboxes.snapshot_failed"
    default_message = "The sandbox could not be put to sleep; it keeps running."


# What a sandbox row says when it has no runtime: a new one gets its own credential.
NO_RUNTIME = {
    "runtime_id": "",
    "network_address": None,
    "runtime_credential": "",
    "runtime_credential_hash": "",
}

# The workspace is (or should be) in snapshots only: nothing to keep in a runtime.
WORKSPACE_IN_SNAPSHOTS = (
    Sandbox.State.SLEEPING,
    Sandbox.State.RESTORING,
    Sandbox.State.UNRESTORABLE,
)

# A runtime works on the workspace: it is the user's, and newer than any snapshot.
IN_USE = {"has_workspace": True, "newer_than_snapshot": True}

# A runtime exists and holds the workspace in these states. SNAPSHOTTING too: the
# runtime is removed only after the state says SLEEPING.
RUNTIME_STATES = (Sandbox.State.RUNNING, Sandbox.State.SNAPSHOTTING)

# What QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES counts: a runtime, or one on its way.
HOLDS_RUNTIME = (Sandbox.State.PROVISIONING, Sandbox.State.RESTORING, *RUNTIME_STATES)


# --- lifecycle ---------------------------------------------------------------------


def _lock_key(sandbox_id) -> str:
    return f"quor-sandbox:{sandbox_id}"


def sandbox_lock(sandbox_id):
    """Serialises lifecycle work on one sandbox across processes."""
    return advisory_lock(_lock_key(sandbox_id))


def _set_state(sandbox: Sandbox, state: str, **fields) -> None:
    Sandbox.objects.filter(pk=sandbox.pk).update(state=state, updated_at=timezone.now(), **fields)
    sandbox.refresh_from_db()


def proxy_environment(proxy_address: str, principal: str, token: str) -> dict[str, str]:
    """The proxy settings every program in the sandbox follows, with its identity."""
    url = f"http://{principal}:{token}@{proxy_address}:{settings.QUOR_EGRESS_PROXY_PORT}"
    local = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
        "NO_PROXY": local, "no_proxy": local,
    }  # fmt: skip


def sandbox_identity_environment(
    sandbox: Sandbox, *, session: Session | None = None
) -> dict[str, str]:
    """What the sandbox's commands run with: placeholders stand in for every credential
    (the proxy swaps in the real one), and the proxy settings carry the sandbox's
    identity, or the session's for its commands. Sent with each command, never in the
    runtime's own environment: a runtime from the warm pool holds none of it until a
    command of its sandbox runs."""
    proxy_address = get_backend(sandbox.backend).egress_proxy_address()
    principal, token = (
        (f"{SESSION_PRINCIPAL_PREFIX}{session.pk}", session.proxy_token)
        if session
        else (SANDBOX_PRINCIPAL, sandbox.proxy_token)
    )
    return {
        **proxy_environment(proxy_address, principal, token),
        "QUOR_API_TOKEN": sandbox.placeholder,
        "QUOR_CREDENTIAL_PLACEHOLDER": sandbox.placeholder,
        "ANTHROPIC_API_KEY": sandbox.placeholder,
        "OPENAI_API_KEY": sandbox.placeholder,
        "OPENROUTER_API_KEY": sandbox.placeholder,
    }


def stop_agent_process(*, session: Session) -> None:
    """SIGTERM to the session's agent runtime, if it runs."""
    sandbox = session.sandbox
    if sandbox.state not in RUNTIME_STATES:
        return
    try:
        get_backend(sandbox.backend).exec(
            sandbox.backend_sandbox_id,
            image.stop_agent_argv(str(session.pk)),
            cwd=WORKSPACE,
            env={},
            timeout_s=10,
            output_limit=4096,
        )
    except (RuntimeMissing, BackendError):
        return  # no runtime, no agent to stop


def get_or_create_sandbox(*, user) -> Sandbox:
    """A concurrent request's sandbox is found, not created twice: get_or_create reads
    the row again when its insert meets the unique user."""
    sandbox, _ = Sandbox.objects.get_or_create(
        user=user, defaults={"backend": settings.QUOR_SANDBOX_BACKEND}
    )
    return sandbox


def sandbox_request(*, user, network_policy: str | None = None) -> Sandbox:
    """Records that the user wants their sandbox running and enqueues the work."""
    check_sandbox_access(user)
    check_sandbox_capacity(user=user)
    sandbox = get_or_create_sandbox(user=user)
    check_workspace_restorable(sandbox)
    if network_policy and network_policy != sandbox.network_policy:
        Sandbox.objects.filter(pk=sandbox.pk).update(network_policy=network_policy)
        sandbox.refresh_from_db()
    send_on_commit("sandboxes.tasks.ensure_sandbox", str(sandbox.pk))
    return sandbox


def _organization_id(user_id):
    return (
        Membership.objects.filter(user_id=user_id).values_list("organization_id", flat=True).first()
    )


def _check_sandbox_limit(organization_id, *, other_than) -> None:
    running = (
        Sandbox.objects.filter(
            user__membership__organization_id=organization_id, state__in=HOLDS_RUNTIME
        )
        .exclude(pk=other_than)
        .count()
    )
    if running >= settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES:
        raise SandboxLimitReached(
            f"Your organization has {running} sandboxes running, its limit: yours can start "
            "when one of them has gone to sleep."
        )


def check_sandbox_capacity(*, user) -> None:
    """Before work that needs the user's sandbox running: refused (429) at once when it
    has no runtime and the organization's limit is reached. `_runtime_slot` checks
    again where a runtime really starts."""
    if not settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES:
        return
    sandbox = Sandbox.objects.filter(user=user).first()
    organization_id = _organization_id(user.pk)
    if organization_id is None or (sandbox is not None and sandbox.state in HOLDS_RUNTIME):
        return
    _check_sandbox_limit(organization_id, other_than=sandbox.pk if sandbox else None)


@contextlib.contextmanager
def _runtime_slot(sandbox: Sandbox):
    """Around the state change that gives a sandbox a runtime: the organization's
    count and that change are one step across processes (an advisory lock per
    organization), so two starts cannot both take the last place. One that already
    holds a runtime (an upgrade, a wake that died half-way) keeps its place."""
    organization_id = _organization_id(sandbox.user_id)
    if (
        not settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES
        or organization_id is None
        or sandbox.state in HOLDS_RUNTIME
    ):
        yield
        return
    with advisory_lock(f"quor-organization-sandboxes:{organization_id}"):
        _check_sandbox_limit(organization_id, other_than=sandbox.pk)
        yield


def sandbox_ensure(*, user) -> Sandbox:
    """The user's sandbox, running, created or re-created if needed. Idempotent."""
    check_sandbox_access(user)
    sandbox = get_or_create_sandbox(user=user)
    return sandbox_ensure_running(sandbox)


def sandbox_ensure_running(sandbox: Sandbox, *, for_session: Session | None = None) -> Sandbox:
    """Running, on the current image; `for_session` is the session asking (its own
    running agent does not hold back an upgrade). Never for a deactivated owner, whoever
    asks (a colleague opening a shared web app, a scheduled run): checked under the
    sandbox's lock, which the deactivation's sleep takes too."""
    try:
        return _ensure_running(sandbox, for_session)
    except BackendUnavailable as exc:  # the Docker daemon (or the cluster) is down
        raise SandboxUnavailable(f"The sandbox is unavailable: {exc}") from exc


def _ensure_running(sandbox: Sandbox, for_session: Session | None) -> Sandbox:
    with sandbox_lock(sandbox.pk):
        sandbox.refresh_from_db()
        if not User.objects.filter(pk=sandbox.user_id, is_active=True).exists():
            raise SandboxUnavailable("The sandbox's owner is deactivated.")
        backend = get_backend(sandbox.backend)
        if sandbox.state == Sandbox.State.UNRESTORABLE:
            raise WorkspaceUnrestorable(_unrestorable_message(sandbox))
        if sandbox.state in (Sandbox.State.SLEEPING, Sandbox.State.RESTORING):
            return _wake(sandbox, backend)
        if sandbox.state in RUNTIME_STATES:  # SNAPSHOTTING: a sleep that died half-way
            status = backend.status(sandbox.backend_sandbox_id)
            if status.running and not _should_upgrade(sandbox, status, backend, for_session):
                _record_runtime(sandbox, status, **IN_USE)  # what a half-done step missed
                return sandbox
            if status.exists:
                # A new image: replace the runtime, keep the workspace.
                backend.destroy(sandbox.backend_sandbox_id, remove_workspace=False)
        if backend.workspace_exists(sandbox.backend_sandbox_id):
            kept = IN_USE  # whatever the row said: the user's, and newer than any snapshot
        elif good_snapshots(sandbox).exists():
            return _wake(sandbox, backend)
        elif sandbox.has_workspace:
            _mark_unrestorable(sandbox, "its workspace is gone and it has no snapshot")
            raise WorkspaceUnrestorable(_unrestorable_message(sandbox))
        else:
            kept = {}
        with _runtime_slot(sandbox):
            _set_state(
                sandbox, Sandbox.State.PROVISIONING, failure_reason="", **kept, **_new_credential()
            )
        status = _start_runtime(sandbox, backend, from_pool=not kept)
        _record_runtime(sandbox, status, **IN_USE)
    return sandbox


def _mark_unrestorable(sandbox: Sandbox, problem: str) -> None:
    """Nothing may replace this workspace with an empty one now but an explicit
    `sandbox_start_empty`; operators see it in the log, users on their pages."""
    logger.error("sandbox %s: workspace cannot be restored: %s", sandbox.pk, problem)
    _set_state(
        sandbox,
        Sandbox.State.UNRESTORABLE,
        failure_reason=f"Could not restore the workspace: {problem}.",
        **NO_RUNTIME,
    )


def _unrestorable_message(sandbox: Sandbox) -> str:
    return (
        f"{sandbox.failure_reason} Your earlier files are not in the sandbox; you can start "
        "again with an empty workspace."
    )


def check_workspace_restorable(sandbox: Sandbox) -> None:
    """New work is refused while the workspace cannot be restored: it would run in an
    empty one."""
    if sandbox.state == Sandbox.State.UNRESTORABLE:
        raise WorkspaceUnrestorable(_unrestorable_message(sandbox))


def sandbox_start_empty(*, sandbox: Sandbox, actor=None, via: str) -> Sandbox:
    """The explicit way on from a workspace that cannot be restored: the next start
    gives an empty workspace. Recorded with who asked (`actor`, a user acting on their
    own sandbox; None for an operator) and what it replaced."""
    if actor is not None:
        check_sandbox_access(actor)
    with sandbox_lock(sandbox.pk):
        sandbox.refresh_from_db()
        if sandbox.state != Sandbox.State.UNRESTORABLE:
            raise WorkspaceNotLost(
                f"The sandbox is {sandbox.get_state_display().lower()}: its workspace is "
                "not lost, so it is not replaced."
            )
        with transaction.atomic():
            _record_reset(sandbox, WorkspaceReset.Action.STARTED_EMPTY, actor, via)
            _set_state(
                sandbox,
                Sandbox.State.ABSENT,
                has_workspace=False,
                newer_than_snapshot=False,
                failure_reason="",
            )
    return sandbox


def _record_reset(sandbox: Sandbox, action: str, actor, via: str, replaced: str = "") -> None:
    logger.warning("sandbox %s: %s (%s)", sandbox.pk, WorkspaceReset.Action(action).label, via)
    WorkspaceReset.objects.create(
        sandbox=sandbox,
        action=action,
        actor=actor,
        via=via,
        replaced=replaced or _state_described(sandbox),
    )


def _state_described(sandbox: Sandbox) -> str:
    return f"{sandbox.get_state_display()}. {sandbox.failure_reason}".strip()


def _new_credential() -> dict:
    """A new runtime gets a new Quor credential; the old one stops working now."""
    credential = new_secret_token()
    return {"runtime_credential": credential, "runtime_credential_hash": hash_token(credential)}


@metrics.sandbox_operation("start")
def _start_runtime(sandbox: Sandbox, backend, *, from_pool: bool):
    """A ready runtime from the warm pool when the sandbox has no workspace to keep,
    else a new one (or its own, started again)."""
    try:
        return (from_pool and pool_take(sandbox, backend)) or backend.ensure(
            runtime_spec(sandbox.backend_sandbox_id)
        )
    except BackendError as exc:
        _set_state(sandbox, Sandbox.State.FAILED, failure_reason=str(exc))
        raise SandboxUnavailable(f"The sandbox could not be started: {exc}") from exc
    except Exception as exc:  # never leave the row "provisioning" or "restoring" for good
        _set_state(sandbox, Sandbox.State.FAILED, failure_reason=f"Internal error: {exc!r}")
        raise


def _record_runtime(sandbox: Sandbox, status, **fields) -> None:
    _set_state(
        sandbox,
        Sandbox.State.RUNNING,
        runtime_id=status.runtime_id,
        image_ref=status.image_ref,
        network_address=status.network_address or None,
        last_activity_at=timezone.now(),
        **fields,
    )


# --- sleep and wake ----------------------------------------------------------------


def sandbox_is_idle(sandbox: Sandbox) -> bool:
    """No agent working and no activity (API, WebSocket, web app) for
    QUOR_SANDBOX_IDLE_SECONDS."""
    cutoff = timezone.now() - timedelta(seconds=settings.QUOR_SANDBOX_IDLE_SECONDS)
    quiet_since = sandbox.last_activity_at or sandbox.updated_at
    working = sandbox.sessions.filter(status__in=(Session.Status.PENDING, Session.Status.RUNNING))
    return quiet_since < cutoff and not working.exists()


def sandbox_touch(sandbox_id) -> None:
    """Records activity on the sandbox (at most one write a minute)."""
    now = timezone.now()
    stale = Q(last_activity_at__isnull=True) | Q(last_activity_at__lt=now - timedelta(seconds=60))
    Sandbox.objects.filter(stale, pk=sandbox_id).update(last_activity_at=now)


def session_in_use(user, session_id) -> Session:
    """The user's own session (404 otherwise), and a mark of activity on its sandbox: a
    user at work on a session (API, pages, the live event stream) keeps it awake."""
    session = get_session_for_user(user, session_id)
    sandbox_touch(session.sandbox_id)
    return session


def sandboxes_sleep_idle() -> list[str]:
    """Enqueues a sleep for every running sandbox that looks idle; the task checks
    again under the sandbox's lock. A SNAPSHOTTING one is a sleep that died half-way."""
    cutoff = timezone.now() - timedelta(seconds=settings.QUOR_SANDBOX_IDLE_SECONDS)
    candidates = [
        str(pk)
        for pk in Sandbox.objects.filter(
            state__in=RUNTIME_STATES, last_activity_at__lt=cutoff
        ).values_list("pk", flat=True)
    ]
    for sandbox_id in candidates:
        send_on_commit("sandboxes.tasks.sleep_sandbox", sandbox_id)
    return candidates


def sandbox_sleep(*, sandbox: Sandbox, force: bool = False) -> Snapshot | None:
    """Snapshots the workspace to the file store, then removes the runtime. Only when
    idle, unless forced (an operator). Returns the snapshot, or None if there was
    nothing to do. The state says SLEEPING only once a verified snapshot is recorded,
    and the runtime goes only after that: a crash anywhere leaves a running sandbox
    with its data, or a sleeping one with a good snapshot."""
    with sandbox_lock(sandbox.pk):
        sandbox.refresh_from_db()
        if sandbox.state not in RUNTIME_STATES or not (force or sandbox_is_idle(sandbox)):
            return None
        backend = get_backend(sandbox.backend)
        if not backend.status(sandbox.backend_sandbox_id).running:
            return None  # nothing to snapshot; reconciliation deals with the row
        return _put_to_sleep(sandbox, backend)


@metrics.sandbox_operation("sleep")
def _put_to_sleep(sandbox: Sandbox, backend) -> Snapshot:
    """The sleep itself, under the sandbox's lock."""
    _set_state(sandbox, Sandbox.State.SNAPSHOTTING)
    try:
        _stop_sandbox_processes(sandbox, backend)
        snapshot = snapshot_take(sandbox, backend)
    except Exception as exc:  # whatever it was, the runtime still has the data
        runtime_ready.send(Sandbox, sandbox=sandbox, woke=False)
        # Counted as activity: the next attempt comes after another idle period.
        _set_state(
            sandbox,
            Sandbox.State.RUNNING,
            failure_reason=f"Could not sleep: {exc}",
            last_activity_at=timezone.now(),
        )
        raise SnapshotFailed(f"The sandbox could not be put to sleep: {exc}") from exc
    _set_state(
        sandbox,
        Sandbox.State.SLEEPING,
        failure_reason="",
        newer_than_snapshot=False,
        **NO_RUNTIME,
    )
    backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)
    snapshots_prune(sandbox)
    return snapshot


def _stop_sandbox_processes(sandbox: Sandbox, backend) -> None:
    """Before a snapshot: web app servers and background jobs stop (web apps start
    again on wake, or at once if the sleep fails)."""
    result = backend.exec(
        sandbox.backend_sandbox_id,
        image.stop_processes_argv(),
        cwd=WORKSPACE,
        env={},
        timeout_s=30,
        output_limit=4096,
    )
    if result.exit_code != 0:
        raise BackendError(f"could not stop the sandbox's processes: {result.stderr.decode()}")


@metrics.sandbox_operation("wake")
def _wake(sandbox: Sandbox, backend) -> Sandbox:
    """A new runtime with the newest good snapshot in its workspace (an older one if
    that is damaged), then Skills, Library and web apps; only then RUNNING. Always from
    a fresh runtime, so a wake that died half-way is simply done again. A failure that
    is not the snapshot's (the runtime will not start, the disk is full) leaves the
    sandbox asleep, to be woken next time. A workspace lost while in use (newer than its
    snapshots) comes back as its newest snapshot, and that is recorded and told."""
    lost_in_use, before = sandbox.newer_than_snapshot, _state_described(sandbox)
    with _runtime_slot(sandbox):
        _set_state(sandbox, Sandbox.State.RESTORING, failure_reason="", **_new_credential())
    damaged = []
    for snapshot in good_snapshots(sandbox):
        backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)  # what an attempt left
        try:
            status = pool_take(sandbox, backend) or backend.ensure(
                runtime_spec(sandbox.backend_sandbox_id)
            )
            snapshot_restore(snapshot, backend)
        except (SnapshotDamaged, CorruptBlob) as exc:
            snapshot_mark_damaged(snapshot, str(exc))
            taken = f"{snapshot.created_at:%Y-%m-%d %H:%M}"
            damaged.append(f"the snapshot of {taken} is damaged ({exc})")
            continue
        except (BackendError, FileStoreMisconfigured, FileStoreUnavailable) as exc:
            # Not the snapshot's fault: it stays good, and the sandbox asleep to try again.
            with contextlib.suppress(BackendError):
                backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)
            _set_state(
                sandbox,
                Sandbox.State.SLEEPING,
                failure_reason=f"Could not wake up: {exc}",
                **NO_RUNTIME,
            )
            raise SandboxUnavailable(f"The sandbox could not be woken up: {exc}") from exc
        _set_state(
            sandbox,
            Sandbox.State.RESTORING,
            runtime_id=status.runtime_id,
            image_ref=status.image_ref,
            network_address=status.network_address or None,
        )
        runtime_ready.send(Sandbox, sandbox=sandbox, woke=True)
        notes = damaged
        with transaction.atomic():
            if lost_in_use:
                taken = f"{snapshot.created_at:%Y-%m-%d %H:%M}"
                notes = [
                    f"Its workspace was lost while in use and is back as the snapshot of "
                    f"{taken}: changes made after that are gone",
                    *damaged,
                ]
                _record_reset(
                    sandbox, WorkspaceReset.Action.RESTORED_OLDER, None, "automatic", before
                )
            _record_runtime(sandbox, status, failure_reason="; ".join(notes), **IN_USE)
        return sandbox
    backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)
    _mark_unrestorable(sandbox, "; ".join(damaged) or "it has no snapshot")
    raise WorkspaceUnrestorable(_unrestorable_message(sandbox))


def _should_upgrade(sandbox: Sandbox, status, backend, for_session) -> bool:
    """The runtime runs an older image than the current one, and no agent is working."""
    current = backend.image_ref(settings.QUOR_SANDBOX_IMAGE)
    if not current or status.image_ref == current:
        return False
    working = sandbox.sessions.filter(status=Session.Status.RUNNING)
    if for_session is not None:
        working = working.exclude(pk=for_session.pk)
    return not working.exists()


def sandbox_refresh_state(sandbox: Sandbox) -> Sandbox:
    """Notices a runtime that disappeared behind Quor's back instead of trusting the row."""
    with sandbox_lock(sandbox.pk):
        sandbox.refresh_from_db()
        if sandbox.state in RUNTIME_STATES:
            backend = get_backend(sandbox.backend)
            status = backend.status(sandbox.backend_sandbox_id)
            if not status.running:
                _record_runtime_gone(
                    sandbox, _state_without_runtime(sandbox, backend, status), status
                )
    return sandbox


def sandbox_stop(*, sandbox: Sandbox) -> Sandbox:
    with sandbox_lock(sandbox.pk):
        sandbox.refresh_from_db()
        if sandbox.state in (Sandbox.State.ABSENT, Sandbox.State.STOPPED, *WORKSPACE_IN_SNAPSHOTS):
            return sandbox  # no runtime to stop (a dead wake's is reconciliation's)
        _set_state(sandbox, Sandbox.State.STOPPING)
        get_backend(sandbox.backend).stop(sandbox.backend_sandbox_id)
        _set_state(sandbox, Sandbox.State.STOPPED)
    return sandbox


def sandbox_destroy(
    *, sandbox: Sandbox, remove_workspace: bool = True, actor=None, via: str = "operator"
) -> Sandbox:
    """Removes the runtime (and the workspace, by default: a sleeping sandbox's
    workspace is its snapshots, and removing it is recorded). The row stays, absent, so
    that its sessions keep their history."""
    with sandbox_lock(sandbox.pk):
        sandbox.refresh_from_db()
        backend = get_backend(sandbox.backend)
        if not remove_workspace and sandbox.state in WORKSPACE_IN_SNAPSHOTS:
            if sandbox.state == Sandbox.State.RESTORING:  # a dead wake's partial unpack
                backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)
                _set_state(sandbox, Sandbox.State.SLEEPING, **NO_RUNTIME)
            return sandbox
        with transaction.atomic():
            removed = {}
            if remove_workspace:  # on purpose: nothing to restore if the removal dies half-way
                removed = {"has_workspace": False, "newer_than_snapshot": False}
                if sandbox.has_workspace:
                    _record_reset(sandbox, WorkspaceReset.Action.REMOVED, actor, via)
            _set_state(sandbox, Sandbox.State.STOPPING, **removed)
        backend.destroy(sandbox.backend_sandbox_id, remove_workspace=remove_workspace)
        if remove_workspace:
            snapshots_delete(sandbox)
        _set_state(
            sandbox,
            Sandbox.State.ABSENT,
            failure_reason="",
            **NO_RUNTIME,
        )
    return sandbox


def sandbox_request_removal(*, sandbox: Sandbox, destroy: bool, keep_workspace: bool = False):
    """An operator's stop or destroy: recorded, then done by a task (the backend may
    take its time; the task is safe to run twice)."""
    with transaction.atomic():
        audit_record(
            "sandbox.destroy_requested" if destroy else "sandbox.stop_requested",
            target=sandbox,
            organization=organization_of(sandbox.user),
            changes={"owner": sandbox.user.email, "state": sandbox.state}
            | ({"keep_workspace": keep_workspace} if destroy else {}),
        )
        if destroy:
            send_on_commit(
                "sandboxes.tasks.destroy_sandbox", str(sandbox.pk), "keep" if keep_workspace else ""
            )
        else:
            send_on_commit("sandboxes.tasks.stop_sandbox", str(sandbox.pk))


# --- sessions' workspaces ------------------------------------------------------------


def session_workspace(session: Session) -> str:
    return f"{SESSIONS_DIR}/{session.pk}"


def session_workspace_ensure(*, session: Session) -> str:
    """Creates the session's directory, owned by the sandbox user, private to it."""
    sandbox = sandbox_ensure_running(session.sandbox, for_session=session)
    path = session_workspace(session)
    _make_session_directory(get_backend(sandbox.backend), sandbox, path)
    return path


def _make_session_directory(backend, sandbox: Sandbox, path: str) -> None:
    result = backend.exec(
        sandbox.backend_sandbox_id,
        image.make_session_directory_argv(path),
        cwd=WORKSPACE,
        env={},
        timeout_s=30,
        output_limit=4096,
    )
    if result.exit_code != 0:
        raise SandboxUnavailable(
            f"Could not create the session workspace: {result.stderr.decode()}"
        )


# --- exec ------------------------------------------------------------------------------

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSW|API_?KEY|CREDENTIAL|PRIVATE|AUTH|SESSION_?ID|COOKIE", re.I
)
SECRET_VALUE = re.compile(
    r"(sk-[A-Za-z0-9_-]{16,}|sk-ant-|ghp_|gho_|github_pat_|xox[abpr]-|AKIA[0-9A-Z]{16}|"
    r"-----BEGIN [A-Z ]*PRIVATE KEY|eyJ[A-Za-z0-9_-]{10,}\.eyJ|quor_pat_)"
)


@dataclass(frozen=True)
class ExecRequest:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    timeout_s: int


def validate_exec_request(
    *, argv, cwd=None, env=None, timeout_s=None, workspace=WORKSPACE
) -> ExecRequest:
    """Refuses anything but an argv list, a cwd inside the workspace, env without
    secrets and a bounded timeout: each with a message saying what is wrong."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidInput(
            "argv must be a non-empty list of strings (no shell string).", code="exec.invalid_argv"
        )
    if any("\x00" in a for a in argv):
        raise InvalidInput("argv must not contain NUL bytes.", code="exec.invalid_argv")
    if cwd is None or cwd == "":
        resolved_cwd = workspace
    else:
        if not isinstance(cwd, str) or "\x00" in cwd:
            raise InvalidInput("cwd must be a path.", code="exec.invalid_cwd")
        resolved_cwd = posixpath.normpath(posixpath.join(workspace, cwd))
        if resolved_cwd != workspace and not resolved_cwd.startswith(workspace + "/"):
            raise InvalidInput(f"cwd must stay inside {workspace}.", code="exec.invalid_cwd")
    env = env or {}
    if not isinstance(env, dict):
        raise InvalidInput("env must be an object of strings.", code="exec.invalid_env")
    for name, value in env.items():
        if not isinstance(value, str) or not ENV_NAME.match(str(name)) or "\x00" in value:
            raise InvalidInput(f"env {name!r} is not a valid variable.", code="exec.invalid_env")
        if SECRET_NAME.search(name) or SECRET_VALUE.search(value):
            raise InvalidInput(
                f"env {name!r} looks like a secret; credentials never enter the sandbox.",
                code="exec.secret_in_env",
            )
    if timeout_s is None:
        timeout_s = settings.QUOR_EXEC_DEFAULT_TIMEOUT
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not (0 < timeout_s <= settings.QUOR_EXEC_MAX_TIMEOUT)
    ):
        raise InvalidInput(
            f"timeout must be between 1 and {settings.QUOR_EXEC_MAX_TIMEOUT} seconds.",
            code="exec.invalid_timeout",
        )
    return ExecRequest(argv=argv, cwd=resolved_cwd, env=env, timeout_s=timeout_s)


def sandbox_exec(
    *,
    user,
    session: Session | None = None,
    argv,
    cwd=None,
    env=None,
    timeout_s=None,
    idempotency_key=None,
    via=ExecRecord.Via.API,
) -> ExecRecord:
    """Runs argv in the user's sandbox as the sandbox user; with a session, inside its
    workspace. The run is in the exec journal before it starts: the record comes back
    with the result, or, for an idempotency key used before, the first run's record
    (sandboxes/runtime/journal.py)."""
    if session is not None and session.owner_id != user.pk:
        raise InvalidInput("The session belongs to another user.", code="exec.foreign_session")
    workspace = session_workspace(session) if session else WORKSPACE
    request = validate_exec_request(
        argv=argv, cwd=cwd, env=env, timeout_s=timeout_s, workspace=workspace
    )
    idempotency_key = journal.clean_idempotency_key(idempotency_key)
    membership = check_sandbox_access(user)
    record = journal.exec_begin(
        user=user,
        organization=membership.organization,
        session=session,
        request=request,
        idempotency_key=idempotency_key,
        via=via,
    )
    if record.replayed:
        return record
    try:
        result = _exec_in_sandbox(user, session, request)
    except QuorError as exc:  # refused or unavailable before anything ran
        journal.exec_not_started(record, exc.message)
        raise
    except Exception as exc:
        journal.exec_interrupted(record, f"{type(exc).__name__}: {exc}")
        raise
    return journal.exec_finished(record, result)


def _exec_in_sandbox(user, session: Session | None, request: ExecRequest) -> ExecResult:
    """A sandbox whose row says it runs the current image gets the command at once,
    without the lifecycle lock: the command finds out itself if the runtime is gone
    (RuntimeMissing, raised only when nothing started), and the sandbox is then ensured
    and the command sent again."""
    sandbox = get_or_create_sandbox(user=user)
    env = {**request.env, **sandbox_identity_environment(sandbox, session=session)}
    try:
        if _runs_current_image(sandbox):
            return _run_exec_request(sandbox, session, request, env)
    except RuntimeMissing:
        pass  # the row was behind the runtime
    except BackendUnavailable as exc:  # the Docker daemon (or the cluster) is down
        raise SandboxUnavailable(f"The sandbox is unavailable: {exc}") from exc
    sandbox = sandbox_ensure_running(sandbox, for_session=session)
    try:
        return _run_exec_request(sandbox, session, request, env)
    except RuntimeMissing:
        sandbox_refresh_state(sandbox)
        raise SandboxUnavailable(
            "The sandbox stopped while the command was starting; retry."
        ) from None


# The current image's id as this process last read it, by backend: (id, when read).
_current_images: dict[str, tuple[str, float]] = {}
CURRENT_IMAGE_READ_EVERY_S = 10
# Session directories made in runtimes, as this process made them: (runtime id, path).
_session_directories: set[tuple[str, str]] = set()
SESSION_DIRECTORIES_KEPT = 10_000


def _runs_current_image(sandbox: Sandbox) -> bool:
    """Whether the row says the sandbox runs the current image; a new image is seen
    within CURRENT_IMAGE_READ_EVERY_S."""
    if sandbox.state != Sandbox.State.RUNNING:
        return False
    current, read_at = _current_images.get(sandbox.backend, ("", 0.0))
    if time.monotonic() - read_at > CURRENT_IMAGE_READ_EVERY_S:
        current = get_backend(sandbox.backend).image_ref(settings.QUOR_SANDBOX_IMAGE)
        _current_images[sandbox.backend] = (current, time.monotonic())
    return bool(current) and sandbox.image_ref == current


def _run_exec_request(sandbox: Sandbox, session, request: ExecRequest, env) -> ExecResult:
    """The command, in the session's directory (made unless this process made it in
    this runtime already). First the sandbox is marked in use and its workspace newer
    than its snapshot: a sleep meanwhile must see both."""
    sandbox_touch(sandbox.pk)
    if not (sandbox.has_workspace and sandbox.newer_than_snapshot):
        Sandbox.objects.filter(pk=sandbox.pk).update(**IN_USE)
    backend = get_backend(sandbox.backend)
    made = (sandbox.runtime_id, session_workspace(session)) if session else None
    if made and made not in _session_directories:
        _make_session_directory(backend, sandbox, made[1])
        if len(_session_directories) >= SESSION_DIRECTORIES_KEPT:
            _session_directories.clear()
        _session_directories.add(made)
    return backend.exec(
        sandbox.backend_sandbox_id,
        request.argv,
        cwd=request.cwd,
        env=env,
        timeout_s=request.timeout_s,
        output_limit=settings.QUOR_EXEC_OUTPUT_LIMIT,
    )


# --- files -------------------------------------------------------------------------


def clean_relative_path(path) -> str:
    """A workspace-relative path, or a 400 naming what is wrong with it."""
    if not isinstance(path, str):
        raise InvalidInput("path must be a string.", code="files.invalid_path")
    if "\x00" in path:
        raise InvalidInput("path must not contain NUL bytes.", code="files.invalid_path")
    if path.startswith("/"):
        raise InvalidInput(
            "path must be relative to the session workspace.", code="files.invalid_path"
        )
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidInput("path must not contain '..'.", code="files.invalid_path")
    return "/".join(parts)


FILE_ERROR_STATUS = {"files.not_found": 404}
# The longest a folder may take to be measured before its archive is made.
ARCHIVE_TIMEOUT_S = 300
# The longest tar may run for a folder's download. Where the response is streamed as it
# is made, tar waits on the client, so this bounds the download too: an hour lets the
# largest archive (QUOR_FILES_ARCHIVE_MAX_BYTES, 200 MB) through at about 0.5 Mbit/s.
ARCHIVE_STREAM_TIMEOUT_S = 3600


def _file_error(exc: FileRefused) -> QuorError:
    return QuorError(str(exc), code=exc.code, status=FILE_ERROR_STATUS.get(exc.code, 400))


def _running_backend(session: Session):
    session_workspace_ensure(session=session)
    return get_backend(session.sandbox.backend), session.sandbox.backend_sandbox_id


# What Quor, not the agent, keeps in a session's directory, by name: the links to the
# managed area (read-only copies of the user's Library and the organization's Skills)
# and the agent's instructions, written again at every turn.
MANAGED_LINKS = ("library", "skills")
AGENT_INSTRUCTIONS = image.AGENT_INSTRUCTIONS


def _managed(relpath: str, entry: dict) -> str | None:
    """Which of Quor's own entries of the session's directory `entry` is, if any."""
    if relpath:
        return None
    if entry["name"] in MANAGED_LINKS and entry["type"] == "symlink":
        return entry["name"]
    if entry["name"] == AGENT_INSTRUCTIONS and entry["type"] == "file":
        return "instructions"
    return None


def _in_managed_area(relpath: str) -> bool:
    return relpath.split("/", 1)[0] in MANAGED_LINKS


def _with_managed_area(session: Session, relpath: str, operation):
    """operation(root, relpath) in the session's directory; a path through the link to
    the managed area (`library/...`, refused there as a symlink) is read in the managed
    area itself, where the same files are, without following the link."""
    try:
        return operation(session_workspace(session), relpath)
    except FileRefused as exc:
        if exc.code != "files.symlink_refused" or not _in_managed_area(relpath):
            raise _file_error(exc) from None
    try:
        return operation(f"{WORKSPACE}/{image.MANAGED_AREA}", relpath)
    except FileRefused as exc:
        raise _file_error(exc) from None


def session_files_list(*, session: Session, path: str = "") -> list[dict]:
    """The folder's entries; each says in `managed` whether it is one of Quor's own."""
    relpath = clean_relative_path(path)
    backend, sandbox_id = _running_backend(session)
    entries = _with_managed_area(
        session, relpath, lambda root, rel: backend.list_files(sandbox_id, root, rel)
    )
    return [{**entry, "managed": _managed(relpath, entry)} for entry in entries]


def session_file_open(*, session: Session, path: str) -> tuple[dict, Iterator[bytes]]:
    """The file's description and a stream of its bytes; refused before streaming starts."""
    relpath = clean_relative_path(path)
    if not relpath:
        raise InvalidInput("path must name a file.", code="files.invalid_path")
    backend, sandbox_id = _running_backend(session)
    root, info = _with_managed_area(
        session, relpath, lambda root, rel: (root, backend.stat_path(sandbox_id, root, rel))
    )
    if info["type"] != "file":
        code = "files.symlink_refused" if info["type"] == "symlink" else "files.not_a_file"
        raise InvalidInput(f"{path} is a {info['type']}, not a regular file.", code=code)
    return info, backend.read_file(sandbox_id, root, relpath)


class ArchiveTooLarge(QuorError):
    status = 413
    code = "files.archive_too_large"


def _archived_folder(session: Session, path: str):
    """The folder to archive: (backend, sandbox id, root, folder, download name, bytes
    of its files), or the refusal (not a folder, too large) before anything streams."""
    relpath = clean_relative_path(path)
    backend, sandbox_id = _running_backend(session)

    def stat_folder(root, rel):
        info = backend.stat_path(sandbox_id, root, rel)
        if info["type"] == "symlink":  # `library` itself: its folder is in the managed area
            raise FileRefused("files.symlink_refused", "The path is a symlink.")
        return root, info

    root, info = _with_managed_area(session, relpath, stat_folder)
    if info["type"] != "directory":
        raise InvalidInput(
            f"{path} is a {info['type']}, not a folder.", code="files.not_a_directory"
        )
    folder = relpath or "."
    measured = backend.exec(
        sandbox_id,
        image.folder_size_argv(folder),
        cwd=root,
        env={},
        timeout_s=ARCHIVE_TIMEOUT_S,
        output_limit=4096,
    )
    # Exit 1 with a total: some folder inside could not be read (tar leaves it out too).
    total = measured.stdout.split()[:1]
    if measured.exit_code not in (0, 1) or not total or not total[0].isdigit():
        raise InvalidInput(
            f"The folder could not be read whole: {measured.stderr.decode(errors='replace')}",
            code="files.permission_denied",
        )
    size, limit = int(total[0]), settings.QUOR_FILES_ARCHIVE_MAX_BYTES
    if size > limit:
        raise ArchiveTooLarge(
            f"The folder holds {size} bytes of files, more than the {limit} bytes a download "
            "may hold."
        )
    name = relpath.rsplit("/", 1)[-1] if relpath else f"session-{str(session.pk)[:8]}"
    return backend, sandbox_id, root, folder, f"{name}.tar.gz", size


def session_files_archive_check(*, session: Session, path: str = "") -> dict:
    """What session_files_archive would answer, without making the archive: its file
    name and the bytes of its files, or the same refusal."""
    *_, name, size = _archived_folder(session, path)
    return {"name": name, "size": size}


def session_files_archive(*, session: Session, path: str = "") -> tuple[str, Iterator[bytes]]:
    """The folder as a .tar.gz made by tar in the sandbox, as the sandbox user: a file
    name for it and a stream of its bytes. Refused before anything streams when its
    files add up to more than QUOR_FILES_ARCHIVE_MAX_BYTES; tar runs for at most
    ARCHIVE_STREAM_TIMEOUT_S. Files changed while read are archived as read, unreadable
    ones left out. The whole session's archive leaves out Quor's own entries
    (image.SESSION_OWN_ENTRIES: `.quor/`, `library`, `skills`, AGENTS.md)."""
    backend, sandbox_id, root, folder, name, _ = _archived_folder(session, path)
    argv = with_timeout(image.archive_folder_argv(folder), ARCHIVE_STREAM_TIMEOUT_S)
    return name, backend.exec_stream(sandbox_id, argv, cwd=root)


def session_file_write(*, session: Session, path: str, chunks: Iterable[bytes], size: int) -> dict:
    """Writes the file atomically: it is replaced only when all `size` bytes arrived."""
    relpath = clean_relative_path(path)
    if not relpath:
        raise InvalidInput("path must name a file.", code="files.invalid_path")
    if size > settings.QUOR_MAX_UPLOAD_BYTES:
        raise QuorError(
            f"The upload is larger than {settings.QUOR_MAX_UPLOAD_BYTES} bytes.",
            code="request_too_large",
            status=413,
        )
    backend, sandbox_id = _running_backend(session)
    try:
        return backend.write_file(sandbox_id, session_workspace(session), relpath, chunks, size)
    except FileRefused as exc:
        raise _file_error(exc) from None


# --- reconciliation ----------------------------------------------------------------------


def sandbox_try_lock(sandbox_id):
    """Like sandbox_lock, but yields False at once when someone holds it."""
    return advisory_try_lock(_lock_key(sandbox_id))


@dataclass
class Reconciliation:
    """What `sandboxes_reconcile` found and did (or, with dry_run, would do)."""

    actions: list[str]


# Nobody works on a sandbox in these states without holding its lock: found unlocked,
# the step died half-way.
HALF_DONE = (
    Sandbox.State.PROVISIONING,
    Sandbox.State.SNAPSHOTTING,
    Sandbox.State.RESTORING,
    Sandbox.State.STOPPING,
)


def sandboxes_reconcile(*, dry_run: bool = False) -> Reconciliation:
    """Compares the runtime instances and workspaces carrying this deployment's labels
    with the database, and repairs what differs: an instance or workspace with no live
    row is removed; a row that claims a runtime that is gone is corrected to what is
    there (re-created on demand); a step that died half-way is put back. Each sandbox is
    re-checked under its lock; one being worked on is left alone. Safe to run any time."""
    backend = get_backend(settings.QUOR_SANDBOX_BACKEND)
    instances = {instance.sandbox_id: instance for instance in backend.list_instances()}
    workspaces = set(backend.list_workspaces())
    found = instances.keys() | workspaces
    # The pool first: a runtime taken meanwhile is then the sandbox's, found below.
    pooled = set(PooledRuntime.objects.filter(key__in=found).values_list("key", flat=True))
    known = {
        sandbox.backend_sandbox_id: sandbox.pk
        for sandbox in Sandbox.objects.filter(
            Q(runtime_key__in=found) | Q(runtime_key="", pk__in=[i for i in found if is_uuid(i)])
        ).only("pk", "runtime_key")
    }
    actions = []
    for sandbox_id in sorted(found - known.keys() - pooled):
        actions.append(f"{sandbox_id}: no sandbox row; runtime and workspace removed")
        if not dry_run:
            backend.destroy(sandbox_id, remove_workspace=True)
    if not dry_run:
        unmarked = Q(has_workspace=False) | Q(newer_than_snapshot=False)
        with_workspace = [known[key] for key in workspaces if key in known]
        for sandbox in (
            Sandbox.objects.filter(unmarked, pk__in=with_workspace)
            .exclude(state__in=WORKSPACE_IN_SNAPSHOTS)
        ):  # fmt: skip
            _mark_workspace_kept(sandbox, backend)
    rows = Sandbox.objects.exclude(state__in=(Sandbox.State.ABSENT, Sandbox.State.STOPPED))
    rows = rows | Sandbox.objects.filter(pk__in=[known[key] for key in instances if key in known])
    for sandbox in rows.distinct():
        action = _reconcile_one(sandbox, backend, dry_run=dry_run)
        if action:
            actions.append(f"{sandbox.pk}: {action}")
    return Reconciliation(actions=actions)


def _mark_workspace_kept(sandbox: Sandbox, backend) -> None:
    """A workspace that is there (outside a sleep or a wake) is the user's and newer than
    any snapshot, whatever the row says (rows from before these flags)."""
    with sandbox_try_lock(sandbox.pk) as locked:
        if locked and backend.workspace_exists(sandbox.backend_sandbox_id):
            Sandbox.objects.filter(pk=sandbox.pk).exclude(state__in=WORKSPACE_IN_SNAPSHOTS).update(
                **IN_USE
            )


def _reconcile_one(sandbox: Sandbox, backend, *, dry_run: bool) -> str:
    with sandbox_try_lock(sandbox.pk) as locked:
        if not locked:
            return ""
        sandbox.refresh_from_db()
        state, status = sandbox.state, backend.status(sandbox.backend_sandbox_id)
        if state == Sandbox.State.SLEEPING and status.exists:
            action = "sleeping, but its runtime was still there: removed"
            if not dry_run:
                backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)
            return action
        if state == Sandbox.State.ABSENT and status.exists:
            if not dry_run:
                backend.destroy(sandbox.backend_sandbox_id, remove_workspace=False)
            return "absent, but a runtime was there: removed (workspace kept)"
        if state == Sandbox.State.RESTORING:
            if not dry_run:
                backend.destroy(sandbox.backend_sandbox_id, remove_workspace=True)
                _set_state(sandbox, Sandbox.State.SLEEPING, runtime_id="", network_address=None)
            return "a wake died half-way: sleeping again (the next visit wakes it)"
        if state in (*RUNTIME_STATES, *HALF_DONE) and status.running:
            if state == Sandbox.State.RUNNING:
                return ""
            if not dry_run:  # with its address: a take or start that died never wrote it
                _record_runtime(sandbox, status, failure_reason="", **IN_USE)
                if state == Sandbox.State.SNAPSHOTTING:  # its processes were stopped
                    runtime_ready.send(Sandbox, sandbox=sandbox, woke=False)
            return f"{state} with its runtime running: running"
        if state in (*RUNTIME_STATES, *HALF_DONE):
            gone = _state_without_runtime(sandbox, backend, status)
            if not dry_run:
                _record_runtime_gone(sandbox, gone, status)
            return f"{state}, but its runtime is {status.detail}: now {gone}"
        return ""


def _record_runtime_gone(sandbox: Sandbox, gone: str, status) -> None:
    """What is left of a sandbox whose runtime is not running, with the reason."""
    metrics.SANDBOX_RUNTIMES_LOST.labels(gone).inc()
    if gone == Sandbox.State.UNRESTORABLE:
        _mark_unrestorable(
            sandbox, f"its runtime and workspace were found {status.detail}, with no snapshot"
        )
        return
    reason = f"Its runtime was found {status.detail}; recorded as {gone}."
    if gone == Sandbox.State.SLEEPING and sandbox.newer_than_snapshot:
        reason = (
            f"Its workspace was found {status.detail} while in use: it wakes from its newest "
            "snapshot, without the changes made after it."
        )
    _set_state(
        sandbox,
        gone,
        runtime_id="" if gone != Sandbox.State.STOPPED else sandbox.runtime_id,
        network_address=None,
        failure_reason=reason,
    )


def _state_without_runtime(sandbox: Sandbox, backend, status) -> str:
    """Stopped if the instance is there; absent if its workspace is (a new runtime gets
    it back); sleeping if only a snapshot is left; else unrestorable if it had a
    workspace (never silently a new, empty one), absent if it never had one."""
    if status.exists:
        return Sandbox.State.STOPPED
    if backend.workspace_exists(sandbox.backend_sandbox_id):
        return Sandbox.State.ABSENT
    if good_snapshots(sandbox).exists():
        return Sandbox.State.SLEEPING
    return Sandbox.State.UNRESTORABLE if sandbox.has_workspace else Sandbox.State.ABSENT
