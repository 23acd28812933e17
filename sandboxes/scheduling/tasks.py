"""Celery tasks of scheduled tasks. The name is the one it had in sandboxes/tasks.py."""

from celery import shared_task

from sandboxes.scheduling.services import run_due_scheduled_tasks


@shared_task(name="sandboxes.tasks.run_scheduled_tasks")
def run_scheduled_tasks() -> None:
    """Beat runs this every 30 s; two at once are harmless (rows are locked, skip_locked)."""
    run_due_scheduled_tasks()
