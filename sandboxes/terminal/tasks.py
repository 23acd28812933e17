"""Celery tasks of the terminal's recordings: thin, idempotent."""

from celery import shared_task

from sandboxes.terminal.services import (
    terminal_recordings_delete_old,
    terminal_recordings_finish_stale,
)


@shared_task(name="sandboxes.tasks.tend_terminal_recordings")
def tend_terminal_recordings() -> tuple[int, int]:
    """Beat, every 5 minutes: finishes the recordings of shells that cannot live any
    more, and deletes those past QUOR_TERMINAL_RECORDING_RETENTION_DAYS."""
    return terminal_recordings_finish_stale(), terminal_recordings_delete_old()
