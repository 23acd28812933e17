"""Writes to a user's User Library (synchronised into their sandbox at each turn). The
contents live in the file store; a row keeps the path and the SHA-256."""

from collections.abc import Iterable

from django.conf import settings
from django.db import transaction

from quor.filestore import blob_delete, blob_put
from quor.lib.errors import InvalidInput, NotFound, QuorError
from sandboxes.models import LibraryFile
from sandboxes.runtime.services import clean_relative_path


def _too_large() -> QuorError:
    return QuorError(
        f"Library files are limited to {settings.QUOR_MAX_ATTACHMENT_BYTES} bytes.",
        code="request_too_large",
        status=413,
    )


def _within_limit(chunks: Iterable[bytes]):
    """The chunks, stopping the write (nothing is stored) once they pass the limit."""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > settings.QUOR_MAX_ATTACHMENT_BYTES:
            raise _too_large()
        yield chunk


def library_file_put(*, user, path: str, content: bytes | Iterable[bytes]) -> LibraryFile:
    """Stores `content` (bytes, or chunks streamed into the file store) as the library
    file at `path`, replacing it."""
    path = clean_relative_path(path)
    if not path:
        raise InvalidInput("path must name a file.", code="files.invalid_path")
    if isinstance(content, bytes):
        if len(content) > settings.QUOR_MAX_ATTACHMENT_BYTES:
            raise _too_large()
        content = [content]
    with transaction.atomic():
        blob = blob_put(_within_limit(content))
        item = LibraryFile.objects.select_for_update().filter(owner=user, path=path).first()
        if item is None:
            return LibraryFile.objects.create(owner=user, path=path, blob=blob, sha256=blob.sha256)
        old = item.blob
        item.blob, item.sha256 = blob, blob.sha256
        item.save(update_fields=["blob", "sha256", "updated_at"])
        blob_delete(old)
    return item


def library_file_delete(*, user, path: str) -> None:
    """The row goes, and with it (sandboxes/receivers.py) its blob."""
    deleted, _ = LibraryFile.objects.filter(owner=user, path=clean_relative_path(path)).delete()
    if not deleted:
        raise NotFound("No such library file.")
