"""Celery tasks of the project itself: thin, idempotent."""

from celery import shared_task

from quor import audit, filestore


@shared_task
def delete_orphaned_blobs() -> None:
    """Beat runs this hourly: what crashes and rollbacks left in the file store."""
    filestore.blobs_delete_orphans()


@shared_task
def delete_old_audit_entries() -> int:
    """Beat runs this hourly: entries older than QUOR_AUDIT_RETENTION_DAYS."""
    return audit.audit_entries_delete_old()
