"""Directory and S3 sources: their documents kept in line with their files.

A sync lists the source, reads only the entries that are new or whose size or
modification time changed (knowledge.services.document_put_content then skips content
it already has and enqueues indexing), and deletes the documents whose entry is gone,
but only after a listing that went to the end: a directory that cannot be read or an S3
server out of reach marks the source failed and deletes nothing, and so does a listing
that finds no file at all where there were documents (an unmounted share's empty mount
point). A file that cannot be indexed (too large, of an unsupported type, unreadable) is
named in the source's sync_error and the others go on; one that was indexed before
keeps its document.

One sync of a source runs at a time: it takes the source with one UPDATE (idle or
failed, or syncing but silent for SILENT_AFTER: a crashed worker's) and writes a
heartbeat while it works. Every state change is committed before what follows it.

A directory is walked through directory descriptors and never follows a link (links
are named and skipped), nor reads anything but regular files: a link swapped in while
the walk runs cannot lead out of the directory (knowledge/locations.py has the roots)."""

import functools
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from knowledge import locations, services
from knowledge.models import KnowledgeSource
from quor import filestore
from quor.lib.errors import InvalidInput, QuorError
from quor.lib.tasks import send_on_commit

logger = logging.getLogger(__name__)

HEARTBEAT_EVERY = timedelta(seconds=30)
SILENT_AFTER = timedelta(minutes=10)
MAX_NAMED_FILES = 20  # in sync_error; the count says how many more
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ListingFailed(Exception):
    """The source could not be listed to the end: nothing may be deleted."""


class EntryUnreadable(Exception):
    pass


class SyncTakenOver(Exception):
    """This sync was silent too long and another took the source over."""


@dataclass(frozen=True)
class Entry:
    """A file of the source: its name there (the path below the directory, or the key
    below the prefix), size and modification time, and a function that reads at most n
    bytes of it. `skipped` says why an entry is never read (a link, a special file)."""

    name: str
    size: int = 0
    modified: datetime | None = None
    read: Callable[[int], bytes] | None = None
    skipped: str = ""


def source_request_sync(source: KnowledgeSource) -> None:
    if source.kind not in KnowledgeSource.SYNCED_KINDS:
        raise InvalidInput(
            "Only directory and S3 sources sync; an upload source's files are uploaded.",
            code="knowledge.not_syncable",
        )
    send_on_commit("knowledge.tasks.sync_source", str(source.pk))


def sources_request_sync() -> list[int]:
    """Every directory and S3 source of an active organization (the periodic task)."""
    source_ids = list(
        KnowledgeSource.objects.filter(
            kind__in=KnowledgeSource.SYNCED_KINDS, organization__is_active=True
        ).values_list("pk", flat=True)
    )
    for pk in source_ids:
        send_on_commit("knowledge.tasks.sync_source", str(pk))
    return source_ids


class _Lease:
    """A running sync's hold on its source: the heartbeat it wrote last is its token."""

    def __init__(self, source_id: int, heartbeat_at: datetime):
        self.source_id = source_id
        self.heartbeat_at = heartbeat_at

    def _held(self):
        return KnowledgeSource.objects.filter(
            pk=self.source_id,
            sync_state=KnowledgeSource.SyncState.SYNCING,
            sync_heartbeat_at=self.heartbeat_at,
        )

    def keep(self, *, now: bool = False) -> None:
        """Writes a heartbeat (every HEARTBEAT_EVERY, or `now`); SyncTakenOver if the
        source is no longer this sync's."""
        at = timezone.now()
        if not now and at - self.heartbeat_at < HEARTBEAT_EVERY:
            return
        if not self._held().update(sync_heartbeat_at=at):
            raise SyncTakenOver
        self.heartbeat_at = at

    def end(self, **fields) -> None:
        self._held().update(**fields)


def _take(source_id: int) -> _Lease | None:
    now = timezone.now()
    free = Q(sync_state__in=[KnowledgeSource.SyncState.IDLE, KnowledgeSource.SyncState.FAILED])
    abandoned = Q(
        sync_state=KnowledgeSource.SyncState.SYNCING, sync_heartbeat_at__lt=now - SILENT_AFTER
    )
    taken = (
        KnowledgeSource.objects.filter(pk=source_id, kind__in=KnowledgeSource.SYNCED_KINDS)
        .filter(free | abandoned)
        .update(sync_state=KnowledgeSource.SyncState.SYNCING, sync_heartbeat_at=now)
    )
    return _Lease(source_id, now) if taken else None


def source_sync(source_id: int) -> KnowledgeSource | None:
    """Brings the source's documents in line with its files. Safe to run twice and
    concurrently: None, doing nothing, when the source is not a directory or S3 source
    or another sync has it."""
    lease = _take(source_id)
    if lease is None:
        return None
    source = KnowledgeSource.objects.select_related("organization").get(pk=source_id)
    try:
        not_indexed = _sync(source, lease)
    except SyncTakenOver:
        logger.warning("knowledge source %s: another sync took over this one", source_id)
        return None
    except ListingFailed as error:
        lease.end(sync_state=KnowledgeSource.SyncState.FAILED, sync_error=str(error))
    except QuorError as error:  # the file store out of reach, for one
        lease.end(sync_state=KnowledgeSource.SyncState.FAILED, sync_error=error.message)
    except Exception:
        lease.end(
            sync_state=KnowledgeSource.SyncState.FAILED,
            sync_error="The sync stopped on an unexpected error (in the worker's log).",
        )
        raise
    else:
        lease.end(
            sync_state=KnowledgeSource.SyncState.IDLE,
            sync_error=_summary(not_indexed),
            synced_at=timezone.now(),
        )
    source.refresh_from_db()
    return source


def _sync(source: KnowledgeSource, lease: _Lease) -> list[str]:
    """Puts new and changed entries, deletes documents whose entry is gone; the entries
    not indexed, each with why."""
    known = {
        external_id: (size, modified)
        for external_id, size, modified in source.documents.values_list(
            "external_id", "size", "source_updated_at"
        )
    }
    listed, not_indexed = set(), []
    for entry in _entries(source):
        lease.keep()
        if entry.read is None:
            not_indexed.append(f"{entry.name}: {entry.skipped}")
            continue
        listed.add(entry.name)
        if known.get(entry.name) == (entry.size, entry.modified):
            continue
        problem = _put(source, entry)
        if problem:
            not_indexed.append(f"{entry.name}: {problem}")
    if known and not listed:
        raise ListingFailed(
            f"{source.location} holds no files any more, so its {len(known)} documents are "
            "kept: an unmounted share looks the same. Delete them in the admin if they "
            "should go."
        )
    lease.keep(now=True)  # still this sync's: the listing is the one to delete by
    for document in source.documents.filter(external_id__in=set(known) - listed):
        services.document_delete(document)
    return not_indexed


def _put(source: KnowledgeSource, entry: Entry) -> str:
    """Why the entry could not be indexed; empty when it is on its way."""
    limit = settings.QUOR_KNOWLEDGE_MAX_FILE_BYTES
    try:
        services.check_file_size(entry.size)  # before reading it
        data = entry.read(limit + 1)  # a file that grew since the listing
        services.document_put_content(
            source=source, name=entry.name, data=data, source_updated_at=entry.modified
        )
    except EntryUnreadable as error:
        return f"It cannot be read: {error}."
    except InvalidInput as error:
        return error.message
    return ""


def _summary(not_indexed: list[str]) -> str:
    if not not_indexed:
        return ""
    lines = [f"{len(not_indexed)} files were not indexed:", *not_indexed[:MAX_NAMED_FILES]]
    if len(not_indexed) > MAX_NAMED_FILES:
        lines.append(f"and {len(not_indexed) - MAX_NAMED_FILES} more.")
    return "\n".join(lines)


def _entries(source: KnowledgeSource) -> Iterator[Entry]:
    """The source's entries, its location checked against today's settings first."""
    try:
        if source.kind == KnowledgeSource.Kind.DIRECTORY:
            location = locations.directory_location(source.organization, source.location)
            root = locations.directory_root(source.organization, location)
            return _directory_entries(root, location)
        location = locations.s3_location(source.organization, source.location)
        return _s3_entries(location)
    except InvalidInput as error:
        raise ListingFailed(error.message) from None


# --- a directory ---------------------------------------------------------------------


def _directory_entries(root: str, location: str) -> Iterator[Entry]:
    def stop(error: OSError):
        raise error

    try:
        top = _open_inside_root(root, location)
        try:
            # fwalk opens each directory without following a link, through its parent's
            # descriptor; any directory it cannot read stops the listing.
            for directory, subdirectories, names, directory_fd in os.fwalk(
                ".", onerror=stop, dir_fd=top
            ):
                for name in sorted(subdirectories):
                    info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
                    if stat.S_ISLNK(info.st_mode):
                        subdirectories.remove(name)
                        yield _skipped(_relative(directory, name), "A link, not followed.")
                subdirectories.sort()
                for name in sorted(names):
                    entry = _directory_entry(directory, directory_fd, name)
                    if entry is not None:
                        yield entry
        finally:
            os.close(top)
    except OSError as error:
        raise ListingFailed(
            f"The directory {location} cannot be listed: {error.strerror or error}."
        ) from error


def _open_inside_root(root: str, location: str) -> int:
    """A descriptor of the source's directory, reached from the operator's root one
    directory at a time, never through a link: a directory of the path swapped for a link
    since the location was checked cannot lead the listing out of the root."""
    descriptor = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(os.path.relpath(location, root)).parts:
            if part == ".":
                continue
            inner = os.open(
                part,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK,
                dir_fd=descriptor,
            )
            os.close(descriptor)
            descriptor = inner
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _relative(directory: str, name: str) -> str:
    return os.path.normpath(os.path.join(directory, name))


def _skipped(relative: str, why: str) -> Entry:
    """An entry named in the sync's errors; a name that is not UTF-8 (which PostgreSQL
    cannot store) is shown with its bytes escaped."""
    try:
        relative.encode()
    except UnicodeEncodeError:
        shown = relative.encode(errors="surrogateescape").decode(errors="backslashreplace")
        return Entry(shown, skipped=f"{why} Its name is not UTF-8.")
    return Entry(relative, skipped=why)


def _directory_entry(directory: str, directory_fd: int, name: str) -> Entry | None:
    relative = _relative(directory, name)
    try:
        relative.encode()
    except UnicodeEncodeError:
        return _skipped(relative, "Not indexed.")
    try:
        info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # removed since the directory was read: gone
    if stat.S_ISLNK(info.st_mode):
        return _skipped(relative, "A link, not followed.")
    if not stat.S_ISREG(info.st_mode):
        return _skipped(relative, "Not a regular file.")
    return Entry(
        relative,
        size=info.st_size,
        modified=EPOCH + timedelta(microseconds=info.st_mtime_ns // 1000),  # as stored
        read=functools.partial(_read_file, directory_fd, name),
    )


def _read_file(directory_fd: int, name: str, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `name`, never through a link and never
    waiting on a fifo swapped in since the listing."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        with open(os.open(name, flags, dir_fd=directory_fd), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise EntryUnreadable("it is no longer a regular file")
            return file.read(limit)
    except OSError as error:
        raise EntryUnreadable(error.strerror or str(error)) from error


# --- an S3 prefix --------------------------------------------------------------------


def _s3_entries(location: str) -> Iterator[Entry]:
    """The objects under `bucket/prefix/`, through the file store's S3 client."""
    client = filestore.s3_client()
    bucket, _, prefix = location.partition("/")
    prefix = f"{prefix}/" if prefix else ""
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", ()):
                key = item["Key"]
                if not key.startswith(prefix) or key.endswith("/"):
                    continue  # a server that ignored the prefix; a folder marker
                yield Entry(
                    key[len(prefix) :],
                    size=item["Size"],
                    modified=item["LastModified"],
                    read=functools.partial(_read_object, client, bucket, key),
                )
    except (BotoCoreError, ClientError) as error:
        raise ListingFailed(f"s3://{bucket}/{prefix} cannot be listed: {error}") from error


def _read_object(client, bucket: str, key: str, limit: int) -> bytes:
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            return body.read(limit)
        finally:
            body.close()
    except (BotoCoreError, ClientError) as error:
        raise EntryUnreadable(str(error)) from error
