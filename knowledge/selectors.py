"""Reads of an organization's knowledge sources and documents (the search itself, and
what a member may read: knowledge/search.py)."""

from knowledge.models import KnowledgeDocument, KnowledgeSource


def sources_of(organization):
    """Every source of the organization (an Organization or its id)."""
    return KnowledgeSource.objects.filter(organization=organization)


def source_of(organization, source_id) -> KnowledgeSource | None:
    """A source of this organization; None for any other."""
    return sources_of(organization).filter(pk=source_id).first()


def upload_sources_of(organization):
    """The organization's sources that take uploads."""
    return sources_of(organization).filter(kind=KnowledgeSource.Kind.UPLOAD)


def documents_of(source: KnowledgeSource):
    return source.documents.all()


def document_of(organization, document_id) -> KnowledgeDocument | None:
    """A document of one of this organization's sources; None for any other."""
    return (
        KnowledgeDocument.objects.select_related("source__organization")
        .filter(pk=document_id, source__organization=organization)
        .first()
    )
