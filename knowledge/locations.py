"""Where directory and S3 sources may read: only below what the operator allowed.

An organization admin creates sources, and must reach neither the server's own files
nor another organization's. So directories must resolve inside one of
QUOR_KNOWLEDGE_DIRECTORY_ROOTS and S3 locations (`bucket/prefix`) must lie inside one of
QUOR_KNOWLEDGE_S3_PREFIXES; empty settings refuse the kind. An entry written
`<organization slug>:<entry>` is allowed to that organization only: on a server shared
by several organizations, an entry without a slug is open to every one of them.

The checks run when a source is created and again before every sync (the settings may
have narrowed, a directory may have become a link). A location outside is refused
with the same message whether it exists or not: nothing here tells an admin what the
server holds."""

import os

from django.conf import settings

from knowledge.models import KnowledgeSource
from quor import filestore
from quor.lib.errors import InvalidInput

MAX_LOCATION_CHARS = 1000


def _refuse(message: str):
    raise InvalidInput(message, code="knowledge.invalid_source")


def _entries_for(organization, entries: list[str]) -> list[str]:
    """The entries without a slug, and those written for this organization's slug."""
    allowed = []
    for entry in entries:
        slug, colon, rest = entry.partition(":")
        if not colon or "/" in slug:  # no slug: "/srv/docs", "bucket/pre:fix"
            allowed.append(entry)
        elif slug == organization.slug:
            allowed.append(rest)
    return allowed


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def allowed_directories(organization) -> list[str]:
    return [
        os.path.realpath(root)
        for root in _entries_for(organization, settings.QUOR_KNOWLEDGE_DIRECTORY_ROOTS)
    ]


def directory_root(organization, location: str) -> str:
    """The allowed root that holds `location` (a real path directory_location accepted)."""
    return next(root for root in allowed_directories(organization) if _is_within(location, root))


def allowed_s3_prefixes(organization) -> list[str]:
    return [
        entry.strip("/")
        for entry in _entries_for(organization, settings.QUOR_KNOWLEDGE_S3_PREFIXES)
    ]


def directory_location(organization, location: str) -> str:
    """The directory's real path, if it is inside a root allowed to the organization."""
    roots = allowed_directories(organization)
    if not roots:
        _refuse("Directory sources are not enabled on this server.")
    allowed = "A directory source reads inside " + ", ".join(roots) + " only."
    location = (location or "").strip()
    if not os.path.isabs(location) or "\x00" in location:
        _refuse(f"A directory is an absolute path. {allowed}")
    real = os.path.realpath(location)
    if not any(_is_within(real, root) for root in roots):
        _refuse(f"{location} is not inside an allowed directory. {allowed}")
    if len(real) > MAX_LOCATION_CHARS:
        _refuse(f"A directory's path has at most {MAX_LOCATION_CHARS} characters.")
    return real


def s3_location(organization, location: str) -> str:
    """`bucket/prefix` without slashes around it, if it is inside a prefix allowed to the
    organization. A prefix is a folder: `bucket/team` allows `bucket/team/x`, not
    `bucket/team2`."""
    prefixes = allowed_s3_prefixes(organization)
    if not prefixes:
        _refuse("S3 sources are not enabled on this server.")
    if filestore.s3_client() is None:
        _refuse("S3 sources are read with the file store's S3 client, and this server's file "
                "store is a directory (QUOR_FILE_STORE_S3_BUCKET is not set).")  # fmt: skip
    allowed = "An S3 source reads inside " + ", ".join(prefixes) + " only."
    location = (location or "").strip().strip("/")
    segments = location.split("/")
    if (
        not location
        or len(location) > MAX_LOCATION_CHARS
        or any(segment in ("", ".", "..") for segment in segments)
        or "\x00" in location
    ):
        _refuse(f"An S3 location is bucket/prefix, without empty, . or .. parts. {allowed}")
    if not any(_is_within(location, prefix) for prefix in prefixes):
        _refuse(f"{location} is not inside an allowed S3 prefix. {allowed}")
    return location


def source_location(organization, kind: str, location: str) -> str:
    """The location to store for a new source of this kind, checked."""
    if kind == KnowledgeSource.Kind.UPLOAD:
        if (location or "").strip():
            _refuse("An upload source has no location: its files are uploaded.")
        return ""
    if kind == KnowledgeSource.Kind.DIRECTORY:
        return directory_location(organization, location)
    if kind == KnowledgeSource.Kind.S3:
        return s3_location(organization, location)
    return _refuse("A source's kind is upload, directory or s3.")
