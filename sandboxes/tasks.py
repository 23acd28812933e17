"""Celery tasks: thin, idempotent, by id. Enqueued with transaction.on_commit."""

from celery import shared_task

from sandboxes import services
from sandboxes.models import Sandbox


@shared_task(acks_late=True)
def ensure_sandbox(sandbox_id: str) -> None:
    sandbox = Sandbox.objects.filter(pk=sandbox_id).first()
    if sandbox is None:
        return
    try:
        services.sandbox_ensure_running(sandbox)
    except services.SandboxUnavailable:
        return  # recorded on the row as failed, with the reason


@shared_task
def mark_idle_sandboxes() -> None:
    services.sandboxes_mark_idle()


@shared_task
def run_agent_turn(session_id: str) -> None:
    from sandboxes.sessions import session_run_turn

    session_run_turn(session_id=session_id)


@shared_task
def run_scheduled_tasks() -> None:
    """Beat runs this every 30 s; two at once are harmless (rows are locked, skip_locked)."""
    from sandboxes.scheduled import run_due_scheduled_tasks

    run_due_scheduled_tasks()
