"""Celery tasks of the project itself: thin, idempotent."""

from celery import shared_task

from quor import filestore


@shared_task
def delete_orphaned_blobs() -> None:
    """Beat runs this hourly: what crashes and rollbacks left in the file store."""
    filestore.blobs_delete_orphans()
