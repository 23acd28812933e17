"""Skills: an organization's instructions and files for the agent. A Skill's files are
one bundle in the file store, an uncompressed tar archive built the same way every time
(sorted, no times or owners), so the same files always make the same bytes."""

import io
import tarfile

from django.db import transaction

from quor.filestore import blob_delete, blob_put, blob_read
from quor.lib.errors import InvalidInput
from sandboxes.models import Skill
from sandboxes.runtime.services import clean_relative_path


def bundle_pack(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(files):
            member = tarfile.TarInfo(path)
            member.size, member.mode = len(files[path]), 0o644
            archive.addfile(member, io.BytesIO(files[path]))
    return buffer.getvalue()


def bundle_unpack(data: bytes) -> dict[str, bytes]:
    """The bundle's files by path; anything but plain files at clean paths is refused."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive:
            if not member.isfile() or clean_relative_path(member.name) != member.name:
                raise InvalidInput(f"The Skill bundle holds {member.name!r}, not a plain file.")
            files[member.name] = archive.extractfile(member).read()
    return files


def clean_skill_files(files) -> dict[str, str]:
    """Relative path → text, as the admin edits them; paths are checked like any path
    written into a sandbox."""
    if not isinstance(files, dict) or not all(
        isinstance(path, str) and isinstance(text, str) for path, text in files.items()
    ):
        raise InvalidInput('Files must map paths to text, e.g. {"SKILL.md": "..."}.')
    cleaned = {}
    for path, text in files.items():
        relpath = clean_relative_path(path)
        if not relpath:
            raise InvalidInput(f"{path!r} is not a file path.", code="files.invalid_path")
        cleaned[relpath] = text
    return cleaned


def skill_files(skill: Skill) -> dict[str, bytes]:
    """The Skill's files, read from the file store (checked)."""
    return bundle_unpack(blob_read(skill.bundle)) if skill.bundle_id else {}


@transaction.atomic
def skill_set_files(*, skill: Skill, files: dict[str, str]) -> Skill:
    """Replaces the Skill's files with a new bundle; the old one is deleted."""
    files = clean_skill_files(files)
    old = skill.bundle
    packed = {path: text.encode() for path, text in files.items()}
    skill.bundle = blob_put(bundle_pack(packed)) if packed else None
    skill.save(update_fields=["bundle", "updated_at"])
    if old is not None:
        blob_delete(old)
    return skill


@transaction.atomic
def skill_create(*, organization, name: str, description: str, files: dict[str, str]) -> Skill:
    skill = Skill.objects.create(organization=organization, name=name, description=description)
    return skill_set_files(skill=skill, files=files)
