"""The file store: attachments, User Library content, Skill bundles and snapshots, kept
as blobs in the `quor_files` Django storage (a directory, or an S3-compatible bucket).
This module is the only code that talks to that storage.

A write streams its data in 1 MiB chunks, hashing and counting as it goes, and its
object appears whole or not at all: on the filesystem a temporary file in the same
directory is fsynced, then renamed; on S3 an object exists only once its PUT (or
multipart upload) has completed. The StoredBlob row is created after that, so a row
always names complete bytes. An object without a row (a crash, a rolled-back
transaction) and a temporary file left by a crash are removed by
`blobs_delete_orphans` once they are an hour old. A read checks size and SHA-256
against the row and raises CorruptBlob instead of returning its last bytes.

The store holds a marker object whose id the database records (FileStoreIdentity): a
process configured with another directory or bucket (an operator's command run from
another checkout) is refused before it writes anything, and a blob missing from such a
store is reported as a misconfiguration, never as damage."""

import hashlib
import io
import json
import logging
import os
import secrets
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import BinaryIO

import urllib3
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError
from django.core.files.storage import FileSystemStorage, storages
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from quor.lib.errors import CorruptBlob, FileStoreMisconfigured, FileStoreUnavailable
from quor.models import FileStoreIdentity, StoredBlob

logger = logging.getLogger(__name__)

STORAGE_NAME = "quor_files"
# Outside PREFIX: the orphan sweep never sees it.
MARKER_KEY = "quor-file-store.json"
MISSING_OBJECT_CODES = ("NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403")
CHUNK_SIZE = 1 << 20
PREFIX = "blobs/"
TEMP_PREFIX = ".tmp-"
# Younger objects without a row may belong to a write whose transaction has not
# committed yet; younger temporary files to a write still going on.
ORPHAN_MIN_AGE = timedelta(hours=1)
KEY_BATCH = 1000

# Uploads to S3: 8 MiB parts, 4 in flight, at most 4 held in memory. boto3's default of
# 10 held parts would keep 80 MiB of a stream in memory per upload.
S3_UPLOAD_CONFIG = TransferConfig(
    multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4
)
S3_UPLOAD_CONFIG.max_in_memory_upload_chunks = 4

Source = bytes | bytearray | memoryview | BinaryIO | Iterable[bytes]


@dataclass(frozen=True)
class WrittenObject:
    key: str
    size: int
    sha256: str


@dataclass
class OrphanSweep:
    """What `blobs_delete_orphans` removed (or would remove, in a dry run), by key."""

    objects: list[str] = field(default_factory=list)  # objects with no row
    temp_files: list[str] = field(default_factory=list)  # writes that never finished
    rows: list[str] = field(default_factory=list)  # rows that nothing refers to


def _storage():
    return storages[STORAGE_NAME]


def _is_local(storage) -> bool:
    return isinstance(storage, FileSystemStorage)


def _chunks(source: Source) -> Iterator[bytes]:
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        for start in range(0, len(view), CHUNK_SIZE):
            yield view[start : start + CHUNK_SIZE]
    elif hasattr(source, "read"):
        while chunk := source.read(CHUNK_SIZE):
            yield chunk
    else:
        yield from source


def _new_key() -> str:
    name = uuid.uuid4().hex
    return f"{PREFIX}{name[:2]}/{name}"


def _write_local(storage, key: str, chunks: Iterator[bytes]) -> tuple[int, str]:
    final = storage.path(key)
    directory = os.path.dirname(final)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    temp = os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
    digest, size = hashlib.sha256(), 0
    try:
        with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
                size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a power loss
    finally:
        os.close(directory_fd)
    return size, digest.hexdigest()


class _HashingReader:
    """A read-only, non-seekable stream over chunks that hashes and counts what it
    hands out. boto3 reads a non-seekable stream once, in order, so what it hashed is
    what was uploaded."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._pending: deque = deque()
        self._pending_size = 0
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        while size < 0 or self._pending_size < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._pending.append(chunk)
            self._pending_size += len(chunk)
        wanted = self._pending_size if size < 0 else min(size, self._pending_size)
        parts, taken = [], 0
        while taken < wanted:
            chunk = memoryview(self._pending.popleft())
            if len(chunk) > wanted - taken:  # split without copying the rest
                self._pending.appendleft(chunk[wanted - taken :])
                chunk = chunk[: wanted - taken]
            parts.append(chunk)
            taken += len(chunk)
        self._pending_size -= wanted
        data = b"".join(parts)
        self.digest.update(data)
        self.size += len(data)
        return data


def _write_s3(storage, key: str, chunks: Iterator[bytes]) -> tuple[int, str]:
    reader = _HashingReader(chunks)
    storage.bucket.Object(key).upload_fileobj(
        reader, ExtraArgs={"ContentType": "application/octet-stream"}, Config=S3_UPLOAD_CONFIG
    )
    return reader.size, reader.digest.hexdigest()


def blob_write_object(source: Source) -> WrittenObject:
    """Writes `source` (bytes, a file-like object or an iterable of byte chunks) under
    a new key, streaming and atomically, without a row. Use `blob_put`; migrations
    call this and create the row with their historical model."""
    storage = _storage()
    key = _new_key()
    if _is_local(storage):
        size, sha256 = _write_local(storage, key, _chunks(source))
    else:
        size, sha256 = _write_s3(storage, key, _chunks(source))
    return WrittenObject(key=key, size=size, sha256=sha256)


def s3_client():
    """The file store's boto3 S3 client (its endpoint, region and credentials), for the
    knowledge sources that read other buckets or prefixes of the same server; None when
    the store is a directory."""
    storage = _storage()
    return None if _is_local(storage) else storage.connection.meta.client


def describe_location(storage=None) -> str:
    storage = storage or _storage()
    if _is_local(storage):
        return f"directory {storage.location}"
    endpoint = storage.endpoint_url or "AWS"
    return f"S3 bucket {storage.bucket_name} at {endpoint}"


def _unreachable(storage, exc) -> FileStoreUnavailable:
    return FileStoreUnavailable(
        f"The file store ({describe_location(storage)}) cannot be reached: {exc}"
    )


def _read_marker(storage) -> str | None:
    """The id in the store's marker object; None when there is none (or no store).
    FileStoreMisconfigured when it cannot be read as one."""
    try:
        if _is_local(storage):
            with open(storage.path(MARKER_KEY), "rb") as f:
                data = f.read()
        else:
            data = storage.bucket.Object(MARKER_KEY).get()["Body"].read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NoSuchBucket"):
            return None
        raise _unreachable(storage, exc) from exc  # 403 included: nothing is readable
    except (BotoCoreError, OSError) as exc:
        raise _unreachable(storage, exc) from exc
    try:
        marker = json.loads(data)["id"]
    except (ValueError, KeyError, TypeError):
        marker = None
    if not isinstance(marker, str) or not 1 <= len(marker) <= 64:
        raise FileStoreMisconfigured(
            f"The file store ({describe_location(storage)}) holds an unreadable {MARKER_KEY}."
        )
    return marker


def _write_marker(storage) -> str:
    marker = secrets.token_hex(16)
    data = json.dumps({"id": marker, "written_to": describe_location(storage)}).encode()
    try:
        if _is_local(storage):
            os.makedirs(storage.location, mode=0o700, exist_ok=True)  # a new store
            _write_local(storage, MARKER_KEY, iter([data]))
        else:
            _write_s3(storage, MARKER_KEY, iter([data]))
    except (BotoCoreError, ClientError, OSError) as exc:
        raise _unreachable(storage, exc) from exc
    return marker


def _object_exists(storage, key: str) -> bool:
    try:
        return storage.exists(key)
    except (BotoCoreError, ClientError, OSError) as exc:
        raise _unreachable(storage, exc) from exc


def _holds_the_newest_blobs(storage) -> bool:
    """A store may become the database's only if it has the database's files (none yet,
    or its newest ones): a store set up from a wrong directory would make every file
    look damaged."""
    newest = list(StoredBlob.objects.order_by("-created_at").values_list("key", flat=True)[:3])
    return not newest or any(_object_exists(storage, key) for key in newest)


def _identity(storage) -> FileStoreIdentity:
    """The database's record of its store. The first check sets it up, one process at a
    time: it adopts the marker the store holds or writes one, only if the store holds
    the database's newest files."""
    identity = FileStoreIdentity.objects.filter(pk=1).first()
    if identity is not None:
        return identity
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('quor-file-store-identity'))")
        identity = FileStoreIdentity.objects.filter(pk=1).first()
        if identity is None:
            if not _holds_the_newest_blobs(storage):
                raise FileStoreMisconfigured(
                    f"This process's file store ({describe_location(storage)}) holds none of "
                    "the database's newest files: it is not the one they were written to. "
                    "Check QUOR_FILE_STORE_DIR or QUOR_FILE_STORE_S3_*."
                )
            marker = _read_marker(storage) or _write_marker(storage)
            identity = FileStoreIdentity.objects.create(
                pk=1, marker=marker, location=describe_location(storage)
            )
    return identity


def file_store_check() -> None:
    """Raises FileStoreMisconfigured unless this process's file store is the one this
    database's blobs are in, FileStoreUnavailable when it cannot be reached."""
    storage = _storage()
    identity = _identity(storage)
    marker = _read_marker(storage)
    if marker != identity.marker:
        found = "has no Quor marker" if marker is None else "belongs to another Quor database"
        raise FileStoreMisconfigured(
            f"This process's file store ({describe_location(storage)}) {found}: it is not "
            f"the one this database's files are in (set up as {identity.location}). Check "
            "QUOR_FILE_STORE_DIR or QUOR_FILE_STORE_S3_* against the workers' settings."
        )


_checked_locations: set[str] = set()


def _file_store_check_once() -> None:
    """file_store_check, once per process and store: the write path pays for it once.
    A directory whose marker has gone since (an unmounted share leaves its empty mount
    point) is checked again, so nothing is written beneath it."""
    storage = _storage()
    location = describe_location(storage)
    if location in _checked_locations and (
        not _is_local(storage) or os.path.isfile(storage.path(MARKER_KEY))
    ):
        return
    file_store_check()
    _checked_locations.add(location)


def blob_put(source: Source) -> StoredBlob:
    """Stores `source` (bytes, a file-like object or an iterable of byte chunks) and
    records it. The row is created only once the bytes are committed; if the write
    fails nothing is recorded and no object is left. Refused in a file store that is not
    the database's."""
    _file_store_check_once()
    written = blob_write_object(source)
    return StoredBlob.objects.create(key=written.key, size=written.size, sha256=written.sha256)


class BlobReader(io.RawIOBase):
    """A blob's bytes as a read-only stream that checks them. Reaching the recorded
    size, it checks the SHA-256 (and that nothing follows) before returning the last
    bytes: a consumer that stops on CorruptBlob never received all of a damaged file."""

    def __init__(self, raw, blob):
        super().__init__()
        self._raw = raw
        self._blob = blob
        self._digest = hashlib.sha256()
        self._seen = 0
        self._verified = False

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK_SIZE), b""))
        data = self._read_raw(size) if size else b""
        self._seen += len(data)
        self._digest.update(data)
        expected = self._blob.size
        if self._seen > expected:
            raise _corrupt(self._blob, f"it is longer than its recorded {expected} bytes")
        if self._seen == expected and not self._verified:
            if self._read_raw(1):
                raise _corrupt(self._blob, f"it is longer than its recorded {expected} bytes")
            if self._digest.hexdigest() != self._blob.sha256:
                raise _corrupt(
                    self._blob,
                    f"its SHA-256 is {self._digest.hexdigest()}, recorded {self._blob.sha256}",
                )
            self._verified = True
        elif size and not data and self._seen < expected:
            raise _corrupt(self._blob, f"it ends after {self._seen} of its {expected} bytes")
        return data

    def _read_raw(self, size: int) -> bytes:
        """A store that fails in the middle of a read is out of reach, not damaged."""
        try:
            return self._raw.read(size)
        except (BotoCoreError, ClientError, OSError, urllib3.exceptions.HTTPError) as exc:
            raise _unreachable(_storage(), exc) from exc

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def _corrupt(blob, problem: str) -> CorruptBlob:
    return CorruptBlob(f"The stored file {blob.key} is damaged: {problem}.")


def _missing(blob) -> CorruptBlob:
    """A missing object is damage only in the database's own store; otherwise the store
    is the wrong one (FileStoreMisconfigured) or out of reach (FileStoreUnavailable)."""
    file_store_check()
    return CorruptBlob(f"The stored file {blob.key} is missing from the file store.")


def blob_open(blob) -> BlobReader:
    """The blob's bytes as a stream that raises CorruptBlob if the object is missing or
    what it reads differs from the row in size or SHA-256. Close it (or use `with`)."""
    storage = _storage()
    try:
        if _is_local(storage):
            raw = open(storage.path(blob.key), "rb")  # noqa: SIM115 (BlobReader closes it)
            actual_size = os.fstat(raw.fileno()).st_size
        else:
            response = storage.bucket.Object(blob.key).get()
            raw, actual_size = response["Body"], response["ContentLength"]
    except FileNotFoundError:
        raise _missing(blob) from None
    except ClientError as exc:
        # Without s3:ListBucket a missing key is 403; _missing tells it from a store the
        # credentials cannot read at all (its marker is then unreadable too).
        if exc.response.get("Error", {}).get("Code") in MISSING_OBJECT_CODES:
            raise _missing(blob) from None
        raise _unreachable(storage, exc) from exc
    except (BotoCoreError, OSError) as exc:
        raise _unreachable(storage, exc) from exc
    if actual_size != blob.size:
        raw.close()
        raise _corrupt(blob, f"it has {actual_size} bytes, recorded {blob.size}")
    return BlobReader(raw, blob)


def blob_chunks(blob, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """The blob's checked bytes in chunks (to stream into a sandbox or a response)."""
    with blob_open(blob) as reader:
        while chunk := reader.read(chunk_size):
            yield chunk


def blob_read(blob) -> bytes:
    """The whole blob, checked: for small ones (Library files, Skill bundles)."""
    with blob_open(blob) as reader:
        return reader.read()


def _delete_object(key: str) -> None:
    _storage().delete(key)


def blob_delete(blob) -> None:
    """Removes the row now and the object once that is committed: a rollback keeps both,
    and a crash in between leaves an orphaned object that `blobs_delete_orphans`
    removes. Raises ProtectedError while a row still refers to the blob."""
    key = blob.key
    StoredBlob.objects.filter(pk=blob.pk).delete()
    transaction.on_commit(lambda: _delete_object(key), robust=True)


def _stored_objects(storage) -> Iterator[tuple[str, datetime]]:
    """Every object and temporary file under PREFIX, with when it last changed."""
    if _is_local(storage):
        root = storage.path(PREFIX)
        for directory, _, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    modified = os.stat(path).st_mtime
                except FileNotFoundError:
                    continue  # a write renamed its temporary file meanwhile
                key = os.path.relpath(path, storage.location).replace(os.sep, "/")
                yield key, datetime.fromtimestamp(modified, tz=UTC)
    else:
        paginator = storage.connection.meta.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=storage.bucket_name, Prefix=PREFIX):
            for entry in page.get("Contents", ()):
                yield entry["Key"], entry["LastModified"]


def _references():
    """Every relation that points at StoredBlob (hidden ones, related_name="+", too)."""
    return [
        relation
        for relation in StoredBlob._meta.get_fields(include_hidden=True)
        if relation.auto_created and not relation.concrete
    ]


def _unreferenced_blobs(cutoff: datetime):
    blobs = StoredBlob.objects.filter(created_at__lt=cutoff)
    for relation in _references():
        refers = relation.related_model.objects.filter(**{relation.field.name: OuterRef("pk")})
        blobs = blobs.filter(~Exists(refers))
    return blobs.order_by("pk")


def blobs_delete_orphans(*, dry_run: bool = False, min_age=ORPHAN_MIN_AGE) -> OrphanSweep:
    """Removes what a crash or a rollback left behind, once older than `min_age`:
    objects with no row, temporary files of writes that never finished, and rows that
    nothing refers to. Returns what it removed (or, with `dry_run`, would remove).
    Only in the database's own store: elsewhere every object would look orphaned."""
    file_store_check()
    storage = _storage()
    cutoff = timezone.now() - min_age
    swept = OrphanSweep()
    old = [key for key, modified in _stored_objects(storage) if modified < cutoff]
    swept.temp_files = [key for key in old if key.rsplit("/", 1)[-1].startswith(TEMP_PREFIX)]
    objects = sorted(set(old) - set(swept.temp_files))
    for start in range(0, len(objects), KEY_BATCH):
        batch = objects[start : start + KEY_BATCH]
        recorded = set(StoredBlob.objects.filter(key__in=batch).values_list("key", flat=True))
        swept.objects += [key for key in batch if key not in recorded]
    unreferenced = list(_unreferenced_blobs(cutoff))
    if dry_run:
        swept.rows = [blob.key for blob in unreferenced]
        return swept
    for key in swept.temp_files + swept.objects:
        _delete_object(key)
    for blob in unreferenced:
        try:
            blob_delete(blob)
        except ProtectedError:
            continue  # referred to since the query
        swept.rows.append(blob.key)
    if swept.objects or swept.temp_files or swept.rows:
        logger.info(
            "file store: removed %d orphaned objects, %d temporary files, %d unreferenced rows",
            len(swept.objects),
            len(swept.temp_files),
            len(swept.rows),
        )
    return swept
