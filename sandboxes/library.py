"""Writes to a user's User Library (synchronised into their sandbox at each turn)."""

import hashlib

from django.conf import settings

from quor.lib.errors import InvalidInput, NotFound, QuorError
from sandboxes.models import LibraryFile
from sandboxes.services import clean_relative_path


def library_file_put(*, user, path: str, content: bytes) -> LibraryFile:
    path = clean_relative_path(path)
    if not path:
        raise InvalidInput("path must name a file.", code="files.invalid_path")
    if len(content) > settings.QUOR_MAX_ATTACHMENT_BYTES:
        raise QuorError(
            f"Library files are limited to {settings.QUOR_MAX_ATTACHMENT_BYTES} bytes.",
            code="request_too_large",
            status=413,
        )
    item, _ = LibraryFile.objects.update_or_create(
        owner=user,
        path=path,
        defaults={"content": content, "sha256": hashlib.sha256(content).hexdigest()},
    )
    return item


def library_file_delete(*, user, path: str) -> None:
    deleted, _ = LibraryFile.objects.filter(owner=user, path=clean_relative_path(path)).delete()
    if not deleted:
        raise NotFound("No such library file.")
