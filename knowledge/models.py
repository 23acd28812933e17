"""Knowledge sources, their documents (each with an access list) and the documents'
indexed chunks.

An access list names principals (knowledge/principals.py): `user:<id>`, `group:<id>`,
`org:<id>`. An empty list means nobody; there is no "everyone" value and NULL is not
allowed. Access lists are written only by knowledge.services.document_set_access, in
the same transaction on the document and on every one of its chunks (the chunks' copy
lets the search filter inside each index scan)."""

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from pgvector.django import HnswIndex, VectorField

EMBEDDING_DIMENSIONS = 384  # knowledge.embeddings' model; another size is a new migration


class KnowledgeSource(models.Model):
    """Where an organization's documents come from. A new document gets the source's
    access list; an admin may change a document's list afterwards."""

    class Kind(models.TextChoices):
        UPLOAD = "upload", "Uploaded files"
        DIRECTORY = "directory", "A directory on the server"
        S3 = "s3", "An S3-compatible prefix"

    # Their documents are their files, kept in line by knowledge.sync; upload sources
    # get files one by one.
    SYNCED_KINDS = (Kind.DIRECTORY, Kind.S3)

    class SyncState(models.TextChoices):
        IDLE = "idle", "Up to date"
        SYNCING = "syncing", "Syncing"
        FAILED = "failed", "Failed"

    organization = models.ForeignKey(
        "quor.Organization", on_delete=models.CASCADE, related_name="knowledge_sources"
    )
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.UPLOAD)
    location = models.CharField(
        max_length=1000,
        blank=True,
        help_text="The directory (kind directory) or bucket/prefix (kind s3), inside what the "
        "operator allowed; empty for uploads. Set once: the documents are its files.",
    )
    default_access = ArrayField(
        models.CharField(max_length=100),
        default=list,
        blank=True,
        help_text="Principals given to new documents: user:<id>, group:<id>, org:<id>. "
        "Empty means nobody.",
    )
    sync_state = models.CharField(max_length=10, choices=SyncState.choices, default=SyncState.IDLE)
    sync_error = models.TextField(blank=True)
    synced_at = models.DateTimeField(
        null=True, blank=True, help_text="When the last sync that listed the whole source ended."
    )
    sync_heartbeat_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the running sync last showed it was alive; one silent for "
        "10 minutes (a crashed worker) is taken over by the next.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["organization", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name"], name="knowledge_source_name_unique_in_org"
            )
        ]

    def __str__(self):
        return self.name


class KnowledgeDocument(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Waiting to be indexed"
        INDEXED = "indexed", "Indexed"
        FAILED = "failed", "Could not be read"

    source = models.ForeignKey(KnowledgeSource, on_delete=models.CASCADE, related_name="documents")
    external_id = models.CharField(
        max_length=1000, help_text="The document's name in its source (a path or a key)."
    )
    title = models.CharField(max_length=500)
    url = models.CharField(max_length=2000, blank=True, help_text="A link or a path.")
    content_type = models.CharField(max_length=20)
    content_sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField(default=0)
    blob = models.ForeignKey(
        "quor.StoredBlob", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    source_updated_at = models.DateTimeField(null=True, blank=True)
    access = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    access_changed_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    error = models.TextField(blank=True, help_text="Why the file could not be read.")
    indexed_sha256 = models.CharField(
        max_length=64, blank=True, help_text="The content the chunks were made from."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["source", "title"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "external_id"], name="knowledge_document_unique_in_source"
            )
        ]
        indexes = [GinIndex(fields=["access"], name="knowledge_document_access")]

    def __str__(self):
        return self.title


class KnowledgeChunk(models.Model):
    """A passage of a document, as searched: its text (the title first), its full-text
    vector, its embedding with the name of the model that made it (the vector search
    compares only embeddings of the model it asks with) and a copy of the document's
    access list."""

    document = models.ForeignKey(KnowledgeDocument, on_delete=models.CASCADE, related_name="chunks")
    # The document's, which never change for its chunks: each ranking then filters this
    # one table inside its index scan, with no join for the planner to put first.
    organization = models.ForeignKey(
        "quor.Organization", on_delete=models.CASCADE, related_name="+"
    )
    source = models.ForeignKey(KnowledgeSource, on_delete=models.CASCADE, related_name="+")
    content_type = models.CharField(max_length=20)
    position = models.PositiveIntegerField()
    text = models.TextField()
    search_vector = SearchVectorField()
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True)
    embedding_model = models.CharField(max_length=100, blank=True)
    access = ArrayField(models.CharField(max_length=100), default=list)

    class Meta:
        ordering = ["document", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["document", "position"], name="knowledge_chunk_unique_position"
            )
        ]
        indexes = [
            GinIndex(fields=["search_vector"], name="knowledge_chunk_search"),
            GinIndex(fields=["access"], name="knowledge_chunk_access", fastupdate=False),
            HnswIndex(
                fields=["embedding"],
                name="knowledge_chunk_nearest",
                # Recall@10 at 100 000 passages (bench): m 16 0.85-0.91 whatever ef_search,
                # m 32 0.95-0.99; ef_construction 64 0.72-0.76.
                m=32,
                ef_construction=200,
                opclasses=["vector_cosine_ops"],
            ),
        ]

    def __str__(self):
        return f"{self.document} #{self.position}"
