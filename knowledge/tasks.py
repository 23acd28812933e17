from celery import shared_task

from knowledge import services, sync


@shared_task(acks_late=True)
def index_document(document_id: str) -> bool:
    """Safe to run twice: indexed content is not indexed again."""
    return services.document_index(int(document_id)) is not None


@shared_task
def requeue_stuck_documents() -> int:
    return len(services.documents_requeue_stuck())


@shared_task(acks_late=True)
def sync_source(source_id: str) -> bool:
    """Safe to run twice and beside another: only one sync of a source runs."""
    return sync.source_sync(int(source_id)) is not None


@shared_task
def sync_all_sources() -> int:
    return len(sync.sources_request_sync())
