"""Skills and the User Library, synchronised into a managed area of the user's sandbox
(/workspace/.quor-managed) and linked into each session's directory.

Sync is incremental by content hash: a manifest in the managed area records the hash of
every file Quor put there, and only files whose hash changed are read from the file
store (checked) and copied again."""

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from quor.filestore import blob_read
from quor.lib.errors import QuorError
from sandboxes import image
from sandboxes.backends import get_backend
from sandboxes.backends.base import BackendError
from sandboxes.image import MANAGED_AREA, WORKSPACE
from sandboxes.models import LibraryFile, Sandbox, Session, Skill
from sandboxes.runtime.services import clean_relative_path, session_workspace
from sandboxes.skills import skill_files

logger = logging.getLogger(__name__)

MANAGED = f"{WORKSPACE}/{MANAGED_AREA}"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ManagedFile:
    sha256: str
    read: Callable[[], bytes]


def managed_files(session: Session) -> dict[str, ManagedFile]:
    """Every file the session's user should have, by path inside the managed area: the
    organization's Skills (small bundles, read whole) and the user's library (read
    only when copied: its rows carry the hash)."""
    files = {}
    organization = session.owner.membership.organization
    for skill in Skill.objects.filter(organization=organization).select_related("bundle"):
        for path, content in skill_files(skill).items():
            files[f"skills/{skill.name}/{path}"] = ManagedFile(
                hashlib.sha256(content).hexdigest(), partial(bytes, content)
            )
    for item in LibraryFile.objects.filter(owner=session.owner).select_related("blob"):
        files[f"library/{clean_relative_path(item.path)}"] = ManagedFile(
            item.sha256, partial(blob_read, item.blob)
        )
    return files


def _run(backend, sandbox_id, argv):
    return backend.exec(sandbox_id, argv, cwd=WORKSPACE, env={}, timeout_s=60, output_limit=1 << 20)


def sync_managed_area(*, session: Session) -> dict[str, int]:
    """Copies what changed, removes what went away, links the area into the session."""
    backend, sandbox_id = get_backend(session.sandbox.backend), session.sandbox.backend_sandbox_id
    wanted = managed_files(session)
    hashes = {path: file.sha256 for path, file in wanted.items()}
    current = _run(backend, sandbox_id, ["cat", f"{MANAGED}/{MANIFEST}"])
    try:
        known = json.loads(current.stdout) if current.exit_code == 0 else {}
    except ValueError:
        known = {}
    changed = [path for path, digest in hashes.items() if known.get(path) != digest]
    removed = [path for path in known if path not in hashes]
    directories = {f"{MANAGED}/{path.rsplit('/', 1)[0]}" for path in changed if "/" in path}
    _run(
        backend,
        sandbox_id,
        ["mkdir", "-p", MANAGED, f"{MANAGED}/skills", f"{MANAGED}/library", *sorted(directories)],
    )
    for path in changed:
        data = wanted[path].read()
        backend.write_file(sandbox_id, MANAGED, path, [data], len(data))
    if removed:
        _run(backend, sandbox_id, ["rm", "-f", "--", *(f"{MANAGED}/{path}" for path in removed)])
    manifest = json.dumps(hashes, sort_keys=True).encode()
    backend.write_file(sandbox_id, MANAGED, MANIFEST, [manifest], len(manifest))
    workspace = session_workspace(session)
    for name in ("skills", "library"):
        _run(backend, sandbox_id, image.link_managed_area_argv(name, workspace))
    return {
        "copied": len(changed),
        "unchanged": len(hashes) - len(changed),
        "removed": len(removed),
    }


def sync_managed_area_after_wake(sender, *, sandbox: Sandbox, woke: bool, **kwargs) -> None:
    """`runtime_ready`: a woken sandbox's managed area is empty (it is not in snapshots).
    A problem does not keep the sandbox from waking: it is logged, and the next turn
    synchronises the area again."""
    latest = sandbox.sessions.order_by("-created_at").first()
    if not woke or latest is None:
        return
    try:
        sync_managed_area(session=latest)
    except (BackendError, QuorError) as exc:
        logger.warning("sandbox %s: Skills and Library not synchronised after a wake: %s",
                       sandbox.pk, exc)  # fmt: skip
