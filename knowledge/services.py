"""Knowledge sources and documents: adding files, indexing them, and access lists.

Content and access are written apart (Onyx lost users' access when a content update
wrote its empty permissions over the synced ones): document_put_content never touches
an access list, and document_set_access is the only writer of one, on the document and
its chunks in one transaction, so a change holds for the very next search."""

import hashlib
import logging
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group
from django.contrib.postgres.search import SearchVector
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from knowledge import chunking, embeddings, extraction, locations
from knowledge.models import KnowledgeChunk, KnowledgeDocument, KnowledgeSource
from knowledge.principals import GROUP, ORGANIZATION, USER, parse_principal
from quor import filestore
from quor.audit import audit_record
from quor.lib.errors import InvalidInput
from quor.lib.tasks import send_on_commit
from quor.models import Membership

logger = logging.getLogger(__name__)

SEARCH_CONFIG = "english"
MAX_NAME_CHARS = 1000
STUCK_AFTER = timedelta(minutes=10)


def validate_access(organization, principals) -> list[str]:
    """The access list, sorted and without repeats, if every principal is well formed
    and names this organization, one of its members or one of its groups. Anything else
    is refused alike, so the answer says nothing of other organizations' groups."""
    if not isinstance(principals, list | tuple) or not all(isinstance(p, str) for p in principals):
        raise InvalidInput(
            "An access list is a list of principals.", code="knowledge.invalid_access"
        )
    wanted = sorted(set(principals))
    parsed = {value: parse_principal(value) for value in wanted}
    bad = [value for value, kind_pk in parsed.items() if kind_pk is None]
    users = {pk for kind, pk in filter(None, parsed.values()) if kind == USER}
    groups = {pk for kind, pk in filter(None, parsed.values()) if kind == GROUP}
    members = set(
        Membership.objects.filter(organization=organization, user_id__in=users).values_list(
            "user_id", flat=True
        )
    )
    existing_groups = set(
        Group.objects.filter(
            pk__in=groups, organization_group__organization=organization
        ).values_list("pk", flat=True)
    )
    for value, kind_pk in parsed.items():
        if kind_pk is None:
            continue
        kind, pk = kind_pk
        if (
            (kind == USER and pk not in members)
            or (kind == GROUP and pk not in existing_groups)
            or (kind == ORGANIZATION and pk != organization.pk)
        ):
            bad.append(value)
    if bad:
        raise InvalidInput(
            "These are not principals of this organization: " + ", ".join(sorted(bad)) + ". "
            "Use user:<id> of a member, group:<id> of a group (GET /api/v1/members/ and "
            "/api/v1/groups/ list them) or org:<this organization's id>.",
            code="knowledge.invalid_access",
            fields={"access": sorted(bad)},
        )
    return wanted


def source_create(*, organization, name: str, kind=KnowledgeSource.Kind.UPLOAD, location="",
                  default_access=()) -> KnowledgeSource:  # fmt: skip
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise InvalidInput(
            "A source needs a name of 1 to 200 characters.", code="knowledge.invalid_source"
        )
    location = locations.source_location(organization, kind, location)
    access = validate_access(organization, list(default_access))
    try:
        with transaction.atomic():
            source = KnowledgeSource.objects.create(
                organization=organization, name=name, kind=kind, location=location,
                default_access=access,
            )  # fmt: skip
            audit_record(
                "knowledge.source_added",
                target=source,
                changes={"kind": kind, "location": location, "default_access": access},
            )
            if kind in KnowledgeSource.SYNCED_KINDS:
                send_on_commit("knowledge.tasks.sync_source", str(source.pk))
            return source
    except IntegrityError:
        raise InvalidInput(
            f"There is already a source named {name!r}.", code="knowledge.invalid_source"
        ) from None


@transaction.atomic
def document_set_access(document: KnowledgeDocument, principals) -> KnowledgeDocument:
    access = validate_access(document.source.organization, principals)
    locked = KnowledgeDocument.objects.select_for_update().get(pk=document.pk)
    if locked.access != access:
        audit_record(
            "knowledge.access_changed",
            target=locked,
            organization=document.source.organization,
            changes={"access": [locked.access, access]},
        )
    locked.access = access
    locked.access_changed_at = timezone.now()
    locked.save(update_fields=["access", "access_changed_at", "updated_at"])
    KnowledgeChunk.objects.filter(document=locked).update(access=access)
    return locked


def _title_from(filename: str) -> str:
    stem = filename.rsplit("/", 1)[-1]
    stem = stem.rsplit(".", 1)[0] if "." in stem.strip(".") else stem
    return stem.replace("_", " ").replace("-", " ").strip() or filename


def check_accepts_uploads(source: KnowledgeSource) -> None:
    """A directory or S3 source's documents are its files: the next sync would delete an
    uploaded one."""
    if source.kind != KnowledgeSource.Kind.UPLOAD:
        raise InvalidInput(
            "This source's documents come from its location; upload to an upload source.",
            code="knowledge.not_an_upload_source",
        )


def check_file_size(size: int) -> None:
    """Callers with an upload check its size before they read it."""
    if size == 0:
        raise InvalidInput("The file is empty.", code="knowledge.invalid_file")
    if size > settings.QUOR_KNOWLEDGE_MAX_FILE_BYTES:
        raise InvalidInput(
            f"The file is larger than {settings.QUOR_KNOWLEDGE_MAX_FILE_BYTES} bytes.",
            code="knowledge.file_too_large",
            status=413,
        )


def document_put_content(*, source: KnowledgeSource, name: str, data: bytes, title: str = "",
                         url: str = "", source_updated_at=None) -> KnowledgeDocument:  # fmt: skip
    """Adds the file `name` to the source, or replaces its content; unchanged content
    changes nothing. A new document gets the source's default access list; an existing
    one keeps its own. Indexing follows in a task. `source_updated_at` (a synced file's
    modification time) is recorded even when the content is unchanged, so that the next
    sync knows the file without reading it."""
    # The name is kept as given: a synced file's name is its identity in the listing.
    if not (name or "").strip() or len(name) > MAX_NAME_CHARS or "\x00" in name:
        raise InvalidInput(
            "A document needs a name of 1 to 1000 characters.", code="knowledge.invalid_file"
        )
    check_file_size(len(data))
    try:
        content_type = extraction.detect_content_type(data, name)
    except extraction.ExtractionFailed as error:
        raise InvalidInput(str(error), code="knowledge.unsupported_file") from None
    sha256 = hashlib.sha256(data).hexdigest()
    title = (title or "").strip()[:500] or _title_from(name)[:500]
    existing = KnowledgeDocument.objects.filter(source=source, external_id=name).first()
    if existing is not None and existing.content_sha256 == sha256 and existing.title == title:
        if source_updated_at and existing.source_updated_at != source_updated_at:
            KnowledgeDocument.objects.filter(pk=existing.pk, content_sha256=sha256).update(
                source_updated_at=source_updated_at, updated_at=timezone.now()
            )
            existing.source_updated_at = source_updated_at
        return existing
    blob = filestore.blob_put(data)
    content = {
        "title": title,
        "url": url or name,
        "content_type": content_type,
        "content_sha256": sha256,
        "size": len(data),
        "blob": blob,
        "source_updated_at": source_updated_at or timezone.now(),
        "state": KnowledgeDocument.State.PENDING,
        "error": "",
    }
    with transaction.atomic():
        default_access = KnowledgeSource.objects.get(pk=source.pk).default_access
        document, created = KnowledgeDocument.objects.select_for_update().get_or_create(
            source=source,
            external_id=name,
            defaults={**content, "access": default_access, "access_changed_at": timezone.now()},
        )
        if not created:
            for field, value in content.items():
                setattr(document, field, value)
            document.save(update_fields=[*content, "updated_at"])  # never the access list
        send_on_commit("knowledge.tasks.index_document", str(document.pk))
    return document


def document_upload(*, source: KnowledgeSource, upload, title: str = "") -> KnowledgeDocument:
    """An uploaded file (Django's UploadedFile) into an upload source, its size checked
    before it is read: the admin, the page and the API all add files this way."""
    check_accepts_uploads(source)
    check_file_size(upload.size)
    return document_put_content(source=source, name=upload.name, data=upload.read(), title=title)


def document_index(document_id: int) -> KnowledgeDocument | None:
    """Extracts, chunks and indexes the document's current content; safe to run twice
    and beside a newer upload (chunks are written only for the content and title read).
    Whatever goes wrong with the file is recorded on the document, which is then done."""
    document = KnowledgeDocument.objects.select_related("blob").filter(pk=document_id).first()
    if document is None or document.blob is None:
        return None
    embedder = embeddings.get_embedder()
    if (
        document.state == KnowledgeDocument.State.INDEXED
        and document.indexed_sha256 == document.content_sha256
        and not document.chunks.exclude(embedding_model=embedder.name).exists()
    ):
        return document
    sha256, title = document.content_sha256, document.title
    try:
        text = extraction.extract_text_isolated(
            filestore.blob_read(document.blob),
            document.content_type,
            timeout=settings.QUOR_KNOWLEDGE_EXTRACT_TIMEOUT_SECONDS,
        )
        if not text.strip():
            raise extraction.ExtractionFailed("The file has no text.")
        passages = chunking.chunk_text(title, text)
        vectors = embedder.embed_passages(passages)
        return _write_chunks(document.pk, sha256, title, passages, vectors, embedder.name)
    except extraction.ExtractionFailed as error:
        reason = str(error)
    except embeddings.NothingToEmbed:
        reason = "The file has no words to index."
    except DatabaseError as error:  # text PostgreSQL refuses, a row gone meanwhile
        logger.exception("indexing document %s failed", document.pk)
        reason = f"The text could not be indexed ({type(error).__name__})."
    with transaction.atomic():
        failed = KnowledgeDocument.objects.filter(
            pk=document.pk, content_sha256=sha256, title=title
        ).update(state=KnowledgeDocument.State.FAILED, error=reason, updated_at=timezone.now())
        if failed:  # the passages of its earlier content would answer for content it lost
            KnowledgeChunk.objects.filter(document_id=document.pk).delete()
    return None


def _write_chunks(
    document_id, sha256, title, passages, vectors, model_name
) -> KnowledgeDocument | None:
    with transaction.atomic():
        locked = KnowledgeDocument.objects.select_for_update().filter(pk=document_id).first()
        if locked is None or (locked.content_sha256, locked.title) != (sha256, title):
            return None  # gone, or newer content arrived: its own task indexes it
        KnowledgeChunk.objects.filter(document=locked).delete()
        organization_id = KnowledgeSource.objects.get(pk=locked.source_id).organization_id
        KnowledgeChunk.objects.bulk_create(
            KnowledgeChunk(
                document=locked,
                organization_id=organization_id,
                source_id=locked.source_id,
                content_type=locked.content_type,
                position=position,
                text=text,
                embedding=vector,
                embedding_model=model_name,
                access=locked.access,
            )
            for position, (text, vector) in enumerate(zip(passages, vectors, strict=True))
        )
        KnowledgeChunk.objects.filter(document=locked).update(
            search_vector=SearchVector("text", config=SEARCH_CONFIG)
        )
        locked.state = KnowledgeDocument.State.INDEXED
        locked.indexed_sha256 = sha256
        locked.error = ""
        locked.save(update_fields=["state", "indexed_sha256", "error", "updated_at"])
    return locked


def document_delete(document: KnowledgeDocument) -> None:
    """Removes the document and its chunks; its stored file goes with the next sweep
    of unreferenced blobs."""
    with transaction.atomic():
        audit_record(
            "knowledge.document_deleted",
            target=document,
            organization=document.source.organization,
        )
        document.delete()


def source_reindex(source: KnowledgeSource) -> int:
    """Indexes every document of the source again (a changed chunking or model)."""
    with transaction.atomic():
        count = source.documents.update(state=KnowledgeDocument.State.PENDING, indexed_sha256="")
        for pk in source.documents.values_list("pk", flat=True):
            send_on_commit("knowledge.tasks.index_document", str(pk))
    return count


def documents_requeue_stuck() -> list[int]:
    """Documents left pending (a lost task, a broker that was down) are sent again, and
    marked as sent: a backlog longer than STUCK_AFTER is not sent again every run."""
    cutoff = timezone.now() - STUCK_AFTER
    with transaction.atomic():
        stuck = list(
            KnowledgeDocument.objects.select_for_update(skip_locked=True)
            .filter(state=KnowledgeDocument.State.PENDING, updated_at__lt=cutoff)
            .values_list("pk", flat=True)
        )
        KnowledgeDocument.objects.filter(pk__in=stuck).update(updated_at=timezone.now())
        for pk in stuck:
            send_on_commit("knowledge.tasks.index_document", str(pk))
    return stuck
