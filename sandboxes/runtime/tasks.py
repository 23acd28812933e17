"""Celery tasks of the runtime lifecycle: thin, idempotent, by id, sent on commit. Their
names are those they had in sandboxes/tasks.py, so queued messages and beat entries keep
working.

Lifecycle tasks acknowledge late: a worker killed in the middle leaves the message to be
delivered again, and the work starts over from what PostgreSQL says."""

import logging

from celery import shared_task
from celery.signals import worker_ready

from quor.filestore import file_store_check
from quor.lib.errors import QuorError
from sandboxes.backends.base import BackendError
from sandboxes.models import Sandbox
from sandboxes.runtime import journal, services
from sandboxes.runtime.pool import pools_refill

logger = logging.getLogger(__name__)


@shared_task(name="sandboxes.tasks.ensure_sandbox", acks_late=True)
def ensure_sandbox(sandbox_id: str) -> None:
    sandbox = Sandbox.objects.filter(pk=sandbox_id).first()
    if sandbox is None:
        return
    try:
        services.sandbox_ensure_running(sandbox)
    except (services.SandboxUnavailable, services.WorkspaceUnrestorable):
        return  # recorded on the row, with the reason


@shared_task(name="sandboxes.tasks.refill_pool")
def refill_pool() -> None:
    """After a sandbox took a pooled runtime, and every 30 s (beat)."""
    try:
        pools_refill()
    except BackendError as exc:
        logger.warning("the warm pool was not refilled: %s", exc)


@shared_task(name="sandboxes.tasks.sleep_idle_sandboxes")
def sleep_idle_sandboxes() -> None:
    services.sandboxes_sleep_idle()


@shared_task(name="sandboxes.tasks.sleep_sandbox", acks_late=True)
def sleep_sandbox(sandbox_id: str) -> None:
    """Idle sandboxes only: checked again under the sandbox's lock."""
    sandbox = Sandbox.objects.filter(pk=sandbox_id).first()
    if sandbox is None:
        return
    try:
        services.sandbox_sleep(sandbox=sandbox)
    except services.SnapshotFailed as exc:
        logger.warning("sandbox %s: %s", sandbox_id, exc)  # recorded on the row; retried


@shared_task(name="sandboxes.tasks.stop_sandbox", acks_late=True)
def stop_sandbox(sandbox_id: str) -> None:
    sandbox = Sandbox.objects.filter(pk=sandbox_id).first()
    if sandbox is not None:
        services.sandbox_stop(sandbox=sandbox)


@shared_task(name="sandboxes.tasks.destroy_sandbox", acks_late=True)
def destroy_sandbox(sandbox_id: str, keep_workspace: str = "") -> None:
    sandbox = Sandbox.objects.filter(pk=sandbox_id).first()
    if sandbox is not None:
        services.sandbox_destroy(
            sandbox=sandbox, remove_workspace=not keep_workspace, via="operator API"
        )


@shared_task(name="sandboxes.tasks.reconcile_sandboxes", acks_late=True)
def reconcile_sandboxes() -> None:
    try:
        found = services.sandboxes_reconcile()
    except BackendError as exc:
        logger.warning("reconciliation skipped: %s", exc)
        return
    for action in found.actions:
        logger.warning("reconciliation: %s", action)


@worker_ready.connect
def reconcile_at_worker_start(sender, **kwargs):
    """A worker that starts (after a crash too) has the runtimes compared with the
    database before it takes other work from the sandboxes queue. It also checks its file
    store: the first check of a deployment marks it as the database's (so that a command
    run with other settings is refused), and a worker with the wrong one says so."""
    reconcile_sandboxes.delay()
    try:
        file_store_check()
    except QuorError as exc:
        logger.error("%s: %s", exc.code, exc.message)
    except Exception:  # the worker still serves; it says why it could not check
        logger.exception("the file store could not be checked")


@shared_task(name="sandboxes.tasks.mark_interrupted_execs")
def mark_interrupted_execs() -> int:
    """Beat, every minute: runs whose process died say so."""
    return journal.execs_mark_interrupted()


@shared_task(name="sandboxes.tasks.delete_old_exec_records")
def delete_old_exec_records() -> int:
    """Beat, hourly: records older than QUOR_EXEC_JOURNAL_RETENTION_DAYS."""
    return journal.exec_records_delete_old()
