"""Snapshots of a sandbox's workspace for sleep and wake (not version history): the
workspace as a tar stream, without the managed area (Skills and Library are synchronised
again on wake), compressed with zstd (with its own content checksum) into the file store,
decompressed again as it is written and its stored size checked before it counts, and
streamed back into a fresh runtime.

The lifecycle around them (when to sleep, the states, the lock) is in services.py."""

import logging
from collections.abc import Iterable, Iterator

import zstandard
from django.conf import settings
from django.db import transaction

from quor.filestore import blob_chunks, blob_delete, blob_open, blob_put
from quor.lib import metrics
from quor.lib.errors import CorruptBlob
from quor.models import StoredBlob
from sandboxes.backends.base import UnreadableFiles
from sandboxes.image import MANAGED_AREA
from sandboxes.models import Sandbox, Snapshot
from sandboxes.runtime.tarstream import without_paths

logger = logging.getLogger(__name__)

# Level 1 in one thread: on a 2-core machine, where Docker builds the archive and Python
# reads it, more compression or more threads slow the whole snapshot (bench/snapshot.py).
ZSTD_LEVEL = 1


class SnapshotDamaged(Exception):
    """A snapshot's compressed stream does not decode whole (checksum, truncation, format),
    as it is written or when it is read for a wake."""


class _Counted:
    def __init__(self, chunks: Iterable[bytes]):
        self.chunks = chunks
        self.total = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.total += len(chunk)
            yield chunk


def _compressed(chunks: Iterable[bytes]) -> Iterator[bytes]:
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
    stream = compressor.compressobj()
    for chunk in chunks:
        if out := stream.compress(chunk):
            yield out
    yield stream.flush()


def _decompressed(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Raises SnapshotDamaged on a checksum mismatch, a bad frame or a cut-short stream,
    CorruptBlob (from the file store) when the stored bytes differ from their record."""
    stream = zstandard.ZstdDecompressor().decompressobj()
    try:
        for chunk in chunks:
            if out := stream.decompress(chunk):
                yield out
    except zstandard.ZstdError as exc:
        raise SnapshotDamaged(f"it does not decompress: {exc}") from exc
    if not stream.eof:
        raise SnapshotDamaged("its compressed stream ends early")


class _Decodable:
    """Passes compressed chunks on and decompresses them as they pass (zstd checks its
    content checksum at the end), counting what they decode to."""

    def __init__(self, chunks: Iterable[bytes]):
        self.chunks = chunks
        self.decoded = 0

    def __iter__(self) -> Iterator[bytes]:
        stream = zstandard.ZstdDecompressor().decompressobj()
        for chunk in self.chunks:
            try:
                self.decoded += len(stream.decompress(chunk))
            except zstandard.ZstdError as exc:
                raise SnapshotDamaged(f"it does not decompress: {exc}") from exc
            yield chunk
        if not stream.eof:
            raise SnapshotDamaged("its compressed stream ends early")


def _stored(archive: Iterable[bytes]) -> tuple[StoredBlob, int]:
    """The archive compressed into the file store once it has decoded whole and the
    store holds all of it; with the archive's size."""
    counted = _Counted(archive)
    compressed = _Decodable(_compressed(counted))
    blob = blob_put(compressed)
    try:
        if compressed.decoded != counted.total:
            raise SnapshotDamaged(f"it decodes to {compressed.decoded} of {counted.total} bytes")
        blob_open(blob).close()  # the stored object is there, at its recorded size
    except (SnapshotDamaged, CorruptBlob):
        blob_delete(blob)
        raise
    return blob, counted.total


def _archive(backend, sandbox_id: str, *, by_sandbox_user: bool) -> Iterator[bytes]:
    """Checked as a whole tar archive (ArchiveError if cut short) and without the
    managed area, whoever made it."""
    if by_sandbox_user:
        made = backend.export_workspace_as_sandbox_user(sandbox_id, excluded=MANAGED_AREA)
    else:
        made = backend.export_workspace(sandbox_id)
    return without_paths(
        made, MANAGED_AREA, read_file=lambda path: backend.export_workspace(sandbox_id, path)
    )


def snapshot_take(sandbox: Sandbox, backend) -> Snapshot:
    """Streams the running sandbox's workspace (its processes stopped) into the file
    store and records it. The archive is made by the sandbox user (fast), or by the
    runtime if the user took read permission away from some file. Raises ArchiveError
    (export cut short), SnapshotDamaged, CorruptBlob or a BackendError; the runtime is
    not touched either way."""
    sandbox_id = sandbox.backend_sandbox_id
    try:
        blob, size = _stored(_archive(backend, sandbox_id, by_sandbox_user=True))
    except UnreadableFiles as exc:
        logger.info("sandbox %s: snapshot through the runtime's archive: %s", sandbox_id, exc)
        blob, size = _stored(_archive(backend, sandbox_id, by_sandbox_user=False))
    metrics.SNAPSHOT_SIZE_BYTES.labels(sandbox.backend).observe(blob.size)
    return Snapshot.objects.create(
        sandbox=sandbox,
        blob=blob,
        size=blob.size,
        sha256=blob.sha256,
        workspace_bytes=size,
        image_ref=sandbox.image_ref,
    )


def snapshot_restore(snapshot: Snapshot, backend) -> None:
    """Streams the snapshot into the sandbox's (fresh, empty) workspace. On
    SnapshotDamaged or CorruptBlob the workspace holds part of it: start again from
    a fresh runtime."""
    backend.import_workspace(
        snapshot.sandbox.backend_sandbox_id, _decompressed(blob_chunks(snapshot.blob))
    )


def snapshot_mark_damaged(snapshot: Snapshot, problem: str) -> None:
    logger.error(
        "snapshot %s of sandbox %s is damaged: %s", snapshot.pk, snapshot.sandbox_id, problem
    )
    Snapshot.objects.filter(pk=snapshot.pk).update(status=Snapshot.Status.DAMAGED, problem=problem)


def good_snapshots(sandbox: Sandbox):
    return sandbox.snapshots.filter(status=Snapshot.Status.GOOD).order_by("-created_at")


def _delete(snapshots) -> int:
    """Rows now, blobs once that is committed."""
    removed = 0
    with transaction.atomic():
        for snapshot in snapshots.select_related("blob"):
            blob = snapshot.blob
            snapshot.delete()
            blob_delete(blob)
            removed += 1
    return removed


def snapshots_delete(sandbox: Sandbox) -> int:
    return _delete(sandbox.snapshots.all())


def snapshots_prune(sandbox: Sandbox) -> int:
    """Keeps the newest QUOR_SNAPSHOT_KEEP good snapshots; removes older ones and every
    damaged one older than the newest good one."""
    keep = list(good_snapshots(sandbox).values_list("pk", flat=True)[: settings.QUOR_SNAPSHOT_KEEP])
    if not keep:
        return 0
    newest = sandbox.snapshots.get(pk=keep[0]).created_at
    return _delete(sandbox.snapshots.exclude(pk__in=keep).filter(created_at__lt=newest))
