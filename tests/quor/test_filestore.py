"""The file store (quor/filestore.py), against a directory and a real S3 server:
atomic writes, checked reads, streaming in bounded memory, and the orphan sweep."""

import hashlib
import io
import tracemalloc
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from quor import filestore
from quor.lib.errors import CorruptBlob
from quor.models import StoredBlob
from sandboxes.library import files as library

pytestmark = pytest.mark.django_db

MIB = 1 << 20


def numbered_chunks(count: int, digest=None):
    """`count` fresh 1 MiB chunks (never the same object twice, so that keeping them
    would show in memory), fed to `digest` as they go."""
    for number in range(count):
        chunk = bytes([number % 251]) * MIB
        if digest is not None:
            digest.update(chunk)
        yield chunk


def test_a_blob_is_stored_and_read_back_with_its_size_and_sha256(file_store):
    blob = filestore.blob_put(b"quarterly numbers\n")

    assert blob.size == 18
    assert blob.sha256 == hashlib.sha256(b"quarterly numbers\n").hexdigest()
    assert file_store.keys() == {blob.key}
    assert filestore.blob_read(blob) == b"quarterly numbers\n"
    assert b"".join(filestore.blob_chunks(blob, chunk_size=4)) == b"quarterly numbers\n"


def test_bytes_a_file_and_an_iterable_of_chunks_are_stored_alike(file_store):
    data = b"x" * (3 * MIB + 5)
    blobs = [
        filestore.blob_put(data),
        filestore.blob_put(io.BytesIO(data)),
        filestore.blob_put(iter([data[:MIB], data[MIB:]])),
    ]

    assert {(blob.size, blob.sha256) for blob in blobs} == {
        (len(data), hashlib.sha256(data).hexdigest())
    }
    assert len({blob.key for blob in blobs}) == 3
    assert all(filestore.blob_read(blob) == data for blob in blobs)


def test_an_empty_blob_is_stored_and_read_back(file_store):
    blob = filestore.blob_put(b"")

    assert (blob.size, filestore.blob_read(blob)) == (0, b"")


def test_the_object_appears_only_when_the_write_is_complete(file_store):
    seen_during_the_write = []

    def chunks():
        yield b"a" * MIB
        seen_during_the_write.append(file_store.keys())
        yield b"b" * MIB

    blob = filestore.blob_put(chunks())

    [during] = seen_during_the_write
    assert blob.key not in during
    assert all(key.rsplit("/", 1)[-1].startswith(filestore.TEMP_PREFIX) for key in during)
    assert file_store.keys() == {blob.key}


@pytest.mark.parametrize("chunks_before_failing", [1, 20])  # one PUT; a multipart upload
def test_a_write_that_fails_midway_leaves_no_row_and_no_object(file_store, chunks_before_failing):
    def failing():
        yield from numbered_chunks(chunks_before_failing)
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        filestore.blob_put(failing())

    assert StoredBlob.objects.count() == 0
    assert file_store.keys() == set()
    if file_store.kind == "s3":
        assert file_store.pending_multipart_uploads() == []


def flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (flip_a_byte, "its SHA-256 is "),
        (lambda data: data[:-10], f"it has {3 * MIB - 10} bytes, recorded {3 * MIB}"),
        (lambda data: data + b"!", f"it has {3 * MIB + 1} bytes, recorded {3 * MIB}"),
    ],
    ids=["flipped byte", "truncated", "extended"],
)
def test_a_damaged_blob_is_reported_as_corrupt_and_never_read_whole(file_store, damage, problem):
    blob = filestore.blob_put(numbered_chunks(3))
    file_store.write_raw(blob.key, damage(file_store.read_raw(blob.key)))

    with pytest.raises(CorruptBlob) as raised:
        filestore.blob_read(blob)

    assert raised.value.code == "filestore.corrupt_blob"
    assert raised.value.message.startswith(f"The stored file {blob.key} is damaged: {problem}")
    received = []
    with pytest.raises(CorruptBlob):
        received.extend(filestore.blob_chunks(blob))
    assert sum(map(len, received)) < blob.size


def test_a_damaged_blob_of_the_right_size_fails_before_its_last_chunk(file_store):
    blob = filestore.blob_put(numbered_chunks(3))
    file_store.write_raw(blob.key, flip_a_byte(file_store.read_raw(blob.key)))
    received = []

    with pytest.raises(CorruptBlob, match=r"its SHA-256 is [0-9a-f]{64}, recorded"):
        received.extend(filestore.blob_chunks(blob))

    assert sum(map(len, received)) == 2 * MIB


def test_a_blob_whose_object_is_gone_is_reported_as_missing(file_store):
    blob = filestore.blob_put(b"soon gone")
    file_store.delete_raw(blob.key)

    with pytest.raises(CorruptBlob) as raised:
        filestore.blob_read(blob)

    assert raised.value.message == f"The stored file {blob.key} is missing from the file store."
    assert raised.value.status == 500


@pytest.mark.parametrize(
    ("kind", "size_mib", "peak_limit_mib"),
    # An S3 upload holds a few 8 MiB parts (filestore.S3_UPLOAD_CONFIG), whatever the size.
    [("local", 50, 6), ("s3", 160, 80)],
)
def test_a_large_stream_is_stored_and_read_in_bounded_memory(
    request, kind, size_mib, peak_limit_mib
):
    request.getfixturevalue(f"{kind}_file_store")
    expected = hashlib.sha256()
    read = hashlib.sha256()
    tracemalloc.start()
    try:
        blob = filestore.blob_put(numbered_chunks(size_mib, expected))
        write_peak = tracemalloc.get_traced_memory()[1]
        before_reading = tracemalloc.get_traced_memory()[0]  # what the upload still holds
        tracemalloc.reset_peak()
        for chunk in filestore.blob_chunks(blob):
            read.update(chunk)
        read_peak = tracemalloc.get_traced_memory()[1] - before_reading
    finally:
        tracemalloc.stop()

    assert (blob.size, blob.sha256) == (size_mib * MIB, expected.hexdigest())
    assert read.hexdigest() == expected.hexdigest()
    assert write_peak < peak_limit_mib * MIB
    assert read_peak < 6 * MIB


def test_deleting_a_blob_removes_its_object_once_the_deletion_is_committed(
    file_store, django_capture_on_commit_callbacks
):
    blob = filestore.blob_put(b"old report")

    with django_capture_on_commit_callbacks(execute=True):
        filestore.blob_delete(blob)

    assert not StoredBlob.objects.filter(pk=blob.pk).exists()
    assert file_store.keys() == set()


def test_a_rolled_back_deletion_keeps_the_row_and_the_object(local_file_store):
    blob = filestore.blob_put(b"kept")

    with pytest.raises(RuntimeError), transaction.atomic():
        filestore.blob_delete(blob)
        raise RuntimeError("the request failed")

    assert filestore.blob_read(StoredBlob.objects.get(pk=blob.pk)) == b"kept"


def test_a_blob_still_referred_to_cannot_be_deleted(local_file_store, owner):
    item = library.library_file_put(user=owner, path="notes.txt", content=b"milk")

    with pytest.raises(ProtectedError):
        filestore.blob_delete(item.blob)


def test_old_objects_without_a_row_and_old_temporary_files_are_removed(local_file_store):
    blob = filestore.blob_put(b"recorded")
    local_file_store.write_raw(blob.key, b"recorded", hours_old=5)
    local_file_store.write_raw("blobs/aa/orphan-old", b"x", hours_old=2)
    local_file_store.write_raw("blobs/aa/orphan-new", b"x")
    local_file_store.write_raw("blobs/bb/.tmp-crashed", b"half", hours_old=2)
    local_file_store.write_raw("blobs/bb/.tmp-writing", b"half")

    swept = filestore.blobs_delete_orphans()

    assert swept.objects == ["blobs/aa/orphan-old"]
    assert swept.temp_files == ["blobs/bb/.tmp-crashed"]
    assert swept.rows == []
    assert local_file_store.keys() == {blob.key, "blobs/aa/orphan-new", "blobs/bb/.tmp-writing"}


def test_a_dry_run_reports_the_orphans_and_removes_nothing(local_file_store):
    local_file_store.write_raw("blobs/aa/orphan", b"x", hours_old=2)
    local_file_store.write_raw("blobs/bb/.tmp-crashed", b"half", hours_old=2)

    swept = filestore.blobs_delete_orphans(dry_run=True)

    assert (swept.objects, swept.temp_files) == (["blobs/aa/orphan"], ["blobs/bb/.tmp-crashed"])
    assert local_file_store.keys() == {"blobs/aa/orphan", "blobs/bb/.tmp-crashed"}


def test_objects_without_a_row_are_removed_from_the_bucket(s3_file_store, owner):
    blob = library.library_file_put(user=owner, path="notes.txt", content=b"milk").blob
    s3_file_store.write_raw("blobs/aa/orphan", b"x")

    assert filestore.blobs_delete_orphans().objects == []  # too young: it may be committing
    swept = filestore.blobs_delete_orphans(min_age=timedelta(0))

    assert (swept.objects, swept.rows) == (["blobs/aa/orphan"], [])
    assert s3_file_store.keys() == {blob.key}


def test_an_old_row_that_nothing_refers_to_is_removed_with_its_object(
    file_store, owner, django_capture_on_commit_callbacks
):
    kept = library.library_file_put(user=owner, path="notes.txt", content=b"milk").blob
    forgotten = filestore.blob_put(b"nobody's")
    young = filestore.blob_put(b"about to be referred to")
    StoredBlob.objects.exclude(pk=young.pk).update(created_at=timezone.now() - timedelta(hours=2))

    with django_capture_on_commit_callbacks(execute=True):
        swept = filestore.blobs_delete_orphans()

    assert swept.rows == [forgotten.key]
    assert set(StoredBlob.objects.values_list("pk", flat=True)) == {kept.pk, young.pk}
    assert file_store.keys() == {kept.key, young.key}


def test_beat_sweeps_the_orphans_every_hour(settings, local_file_store):
    from quor.tasks import delete_orphaned_blobs

    local_file_store.write_raw("blobs/aa/orphan", b"x", hours_old=2)
    [entry] = [
        entry
        for entry in settings.CELERY_BEAT_SCHEDULE.values()
        if entry["task"] == "quor.tasks.delete_orphaned_blobs"
    ]

    delete_orphaned_blobs()

    assert entry["schedule"] == 3600.0
    assert local_file_store.keys() == set()
