"""Sleep and wake against real sandboxes: the workspace goes to the file store and comes
back byte for byte into a new runtime, with Skills, Library and web apps; damaged
snapshots are noticed and an older good one is used; old snapshots are pruned."""

import time

import pytest
from django.utils import timezone

from quor.filestore import blob_read
from quor.lib.errors import CorruptBlob
from quor.models import StoredBlob
from sandboxes.backends.docker import DockerBackend
from sandboxes.image import WORKSPACE
from sandboxes.library.files import library_file_put
from sandboxes.models import Sandbox, Snapshot
from sandboxes.runtime import services
from tests import factories
from tests.environment import PORTS
from webapps.services import webapp_register

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

# Run as the sandbox user inside the sandbox: a mixed workspace (text, a few MB of
# random bytes, an empty file, an executable, a symlink, an empty directory, a name
# with spaces and non-ASCII) in a session's directory.
MAKE_FILES = r"""
set -e
cd "$1"
mkdir -p src/pkg "empty dir" "naïve names"
for i in $(seq 1 40); do printf 'line %s\n' $(seq 1 $i) > src/pkg/mod_$i.py; done
head -c 3000000 /dev/urandom > big.bin
: > empty.txt
printf '#!/bin/sh\necho hi\n' > run.sh && chmod 755 run.sh
ln -s src/pkg/mod_1.py link.py
echo 'été' > "naïve names/café notes.txt"
mkdir -p .quor && echo '{"messages": ["hello"]}' > .quor/conversation.json
"""
# Every path under the workspace but the managed area: type, mode, size, target, sha256.
MANIFEST = r"""
cd /workspace
find . -path ./.quor-managed -prune -o -print0 | sort -z | while IFS= read -r -d '' p; do
  if [ -f "$p" ] && [ ! -L "$p" ]; then h=$(sha256sum "$p" | cut -c1-64); else h=-; fi
  printf '%s|%s|%s|%s\n' "$p" "$(stat -c '%F|%a|%U' "$p")" "$(readlink "$p" || true)" "$h"
done
"""


def run(sandbox, script, *args) -> str:
    result = DockerBackend().exec(
        str(sandbox.pk),
        ["bash", "-c", script, "bash", *args],
        cwd=WORKSPACE,
        env={},
        timeout_s=120,
        output_limit=16 << 20,
    )
    assert result.exit_code == 0, result.stderr.decode()
    return result.stdout.decode()


@pytest.fixture
def session(owner, running_sandbox):
    """A session with files, its Skills and Library linked in as a turn leaves them."""
    from sandboxes.library.managed import sync_managed_area

    session = factories.make_session(owner, sandbox=running_sandbox)
    services.session_workspace_ensure(session=session)
    run(running_sandbox, MAKE_FILES, services.session_workspace(session))
    sync_managed_area(session=session)
    return session


def sleep(sandbox) -> Snapshot:
    snapshot = services.sandbox_sleep(sandbox=sandbox, force=True)
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.SLEEPING
    return snapshot


def test_a_sleeping_sandbox_wakes_with_its_files_byte_for_byte(owner, running_sandbox, session):
    library_file_put(user=owner, path="notes/plan.md", content=b"the plan")
    from sandboxes.library.managed import sync_managed_area

    sync_managed_area(session=session)
    before = run(running_sandbox, MANIFEST)
    assert "big.bin" in before and "café notes.txt" in before

    snapshot = sleep(running_sandbox)
    backend = DockerBackend()
    assert not backend.status(str(running_sandbox.pk)).exists
    assert not backend.workspace_exists(str(running_sandbox.pk))
    assert snapshot.status == Snapshot.Status.GOOD
    assert (snapshot.size, snapshot.sha256) == (snapshot.blob.size, snapshot.blob.sha256)
    assert snapshot.workspace_bytes > 3_000_000
    assert snapshot.size < snapshot.workspace_bytes  # compressed (the text compresses)
    assert running_sandbox.runtime_credential == ""  # no runtime, no credential

    woken = services.sandbox_ensure_running(running_sandbox)
    assert woken.state == Sandbox.State.RUNNING
    assert run(woken, MANIFEST) == before
    # The managed area was not in the snapshot (next test); it is synchronised again.
    assert run(woken, "cat /workspace/.quor-managed/library/notes/plan.md") == "the plan"


def test_the_managed_area_is_not_in_the_snapshot(owner, running_sandbox, session):
    import zstandard

    library_file_put(user=owner, path="secret-plan.md", content=b"x" * 100)
    from sandboxes.library.managed import sync_managed_area

    sync_managed_area(session=session)
    snapshot = sleep(running_sandbox)
    archive = zstandard.ZstdDecompressor().decompressobj().decompress(blob_read(snapshot.blob))
    assert b"secret-plan.md" not in archive
    assert b"big.bin" in archive


def test_hard_links_to_a_library_file_wake_as_files_of_their_own(owner, running_sandbox, session):
    """The archive holds the managed file first (names sort) and the links as links to
    it; leaving the area out must not leave the links out."""
    from sandboxes.library.managed import sync_managed_area

    library_file_put(user=owner, path="notes/plan.md", content=b"the plan")
    sync_managed_area(session=session)
    directory = services.session_workspace(session)
    run(running_sandbox, 'cd "$1" && ln ../../.quor-managed/library/notes/plan.md kept.md '
        "&& ln kept.md also-kept.md", directory)  # fmt: skip
    before = run(running_sandbox, MANIFEST)

    sleep(running_sandbox)
    library_file_put(user=owner, path="notes/plan.md", content=b"a newer plan")
    woken = services.sandbox_ensure_running(running_sandbox)

    assert run(woken, MANIFEST) == before
    # One file with two names (not three: the library's copy is a file of its own).
    links, inode, other_links, other_inode = run(
        woken, 'cd "$1" && stat -c "%h %i" kept.md also-kept.md', directory
    ).split()
    assert (links, other_links, inode) == ("2", "2", other_inode)
    assert run(woken, "cat /workspace/.quor-managed/library/notes/plan.md") == "a newer plan"


def cut_short(chunks, after: int):
    """Docker's archive stopping after `after` bytes, as when the daemon dies mid-stream."""
    sent = 0
    for chunk in chunks:
        if sent + len(chunk) > after:
            yield chunk[: after - sent]
            return
        sent += len(chunk)
        yield chunk


def flipped(chunks):
    """A compressed stream with one byte changed in its second piece."""
    for index, chunk in enumerate(chunks):
        if index == 1:
            chunk = chunk[:100] + bytes([chunk[100] ^ 0xFF]) + chunk[101:]
        yield chunk


@pytest.mark.parametrize("fault", ["export cut short", "stream does not decode"])
def test_a_snapshot_that_fails_is_not_recorded_and_the_sandbox_keeps_running(
    owner, running_sandbox, session, monkeypatch, fault
):
    from sandboxes.runtime import snapshots

    before = run(running_sandbox, MANIFEST)
    blobs = StoredBlob.objects.count()
    if fault == "export cut short":
        export = DockerBackend.export_workspace_as_sandbox_user
        monkeypatch.setattr(
            DockerBackend, "export_workspace_as_sandbox_user",
            lambda self, sandbox_id, **kw: cut_short(export(self, sandbox_id, **kw), 2_000_000),
        )  # fmt: skip
    else:
        compressed = snapshots._compressed
        monkeypatch.setattr(snapshots, "_compressed", lambda chunks: flipped(compressed(chunks)))

    with pytest.raises(services.SnapshotFailed):
        services.sandbox_sleep(sandbox=running_sandbox, force=True)

    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.RUNNING
    assert "Could not sleep" in running_sandbox.failure_reason
    assert not running_sandbox.snapshots.exists()
    assert StoredBlob.objects.count() == blobs  # the partial blob went too
    assert run(running_sandbox, MANIFEST) == before


def test_files_the_sandbox_user_cannot_read_are_in_the_snapshot_too(
    owner, running_sandbox, session, caplog
):
    """The sandbox user makes the archive, unless it took read permission from a file
    (or a directory); then the runtime's own archive is used, and nothing is missing."""
    directory = services.session_workspace(session)
    run(running_sandbox, 'cd "$1" && echo secret > locked.txt && chmod 000 locked.txt '
        "&& mkdir -p shut/in && echo inside > shut/in/f && chmod 000 shut", directory)  # fmt: skip
    before = run(running_sandbox, MANIFEST)

    with caplog.at_level("INFO", logger="sandboxes.runtime.snapshots"):
        sleep(running_sandbox)
    assert "runtime's archive" in caplog.text
    woken = services.sandbox_ensure_running(running_sandbox)

    assert run(woken, MANIFEST) == before
    assert run(woken, 'cd "$1" && stat -c "%a" locked.txt shut', directory).split() == ["0", "0"]
    assert run(woken, 'cd "$1" && chmod 700 shut && chmod 600 locked.txt && '
               "cat locked.txt shut/in/f", directory) == "secret\ninside\n"  # fmt: skip


def test_web_apps_run_again_after_a_wake(owner, running_sandbox, session):
    from webapps.services import webapps_restart

    webapp_register(
        session=session, port=8091, command="python3 -m http.server 8091 --bind 0.0.0.0"
    )
    webapps_restart(running_sandbox)  # as the agent's tool would have started it
    probe = (
        'for i in $(seq 50); do python3 -c "import urllib.request as u; '
        "print(u.urlopen('http://127.0.0.1:8091/run.sh').read().decode())\" 2>/dev/null && exit 0; "
        "sleep 0.1; done; exit 1"
    )
    assert "echo hi" in run(running_sandbox, probe)
    sleep(running_sandbox)
    woken = services.sandbox_ensure_running(running_sandbox)
    assert "echo hi" in run(woken, probe)


def test_a_damaged_snapshot_is_reported_and_the_previous_good_one_is_used(
    owner, running_sandbox, session, local_file_store
):
    first = sleep(running_sandbox)
    first_manifest = run(services.sandbox_ensure_running(running_sandbox), MANIFEST)
    run(running_sandbox, "echo changed > /workspace/sessions/$1/big.bin", str(session.pk))
    second = sleep(running_sandbox)
    damaged = bytearray(local_file_store.read_raw(second.blob.key))
    damaged[len(damaged) // 2] ^= 0xFF
    local_file_store.write_raw(second.blob.key, bytes(damaged))

    woken = services.sandbox_ensure_running(running_sandbox)
    assert woken.state == Sandbox.State.RUNNING
    assert run(woken, MANIFEST) == first_manifest  # the older, good one
    second.refresh_from_db()
    assert second.status == Snapshot.Status.DAMAGED
    assert "SHA-256" in second.problem or "decompress" in second.problem
    assert "damaged" in woken.failure_reason
    first.refresh_from_db()
    assert first.status == Snapshot.Status.GOOD


def test_with_no_usable_snapshot_the_wake_fails_clearly(
    owner, running_sandbox, session, local_file_store
):
    snapshot = sleep(running_sandbox)
    (local_file_store.root / snapshot.blob.key).unlink()
    with pytest.raises(services.WorkspaceUnrestorable) as failed:
        services.sandbox_ensure_running(running_sandbox)
    assert "missing" in str(failed.value)
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.UNRESTORABLE
    assert "Could not restore the workspace" in running_sandbox.failure_reason
    # Decided (docs/decisions.md): never an empty workspace without the user's word.
    with pytest.raises(services.WorkspaceUnrestorable):
        services.sandbox_ensure_running(running_sandbox)
    assert not DockerBackend().status(str(running_sandbox.pk)).exists


def test_only_the_newest_snapshots_are_kept_and_older_blobs_go(
    owner, running_sandbox, session, settings
):
    settings.QUOR_SNAPSHOT_KEEP = 2
    taken = []
    for _ in range(3):
        taken.append(sleep(running_sandbox))
        services.sandbox_ensure_running(running_sandbox)
    assert (
        list(Snapshot.objects.filter(sandbox=running_sandbox).order_by("created_at")) == taken[1:]
    )
    assert not StoredBlob.objects.filter(pk=taken[0].blob_id).exists()
    with pytest.raises(CorruptBlob):
        blob_read(taken[0].blob)  # its object is gone too


def test_a_busy_sandbox_is_not_put_to_sleep_unless_forced(owner, running_sandbox, session):
    Sandbox.objects.filter(pk=running_sandbox.pk).update(last_activity_at=timezone.now())
    assert services.sandbox_sleep(sandbox=running_sandbox) is None
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.RUNNING
    assert DockerBackend().status(str(running_sandbox.pk)).running


def test_a_follow_up_after_sleep_wakes_the_sandbox_and_continues_the_conversation(
    client_for, owner, org, egress_proxy, celery_worker, clean_runtimes, upstream_fakes
):
    from quor.models import ModelProvider
    from sandboxes.models import Session
    from tests.sandboxes.test_agent_session_e2e import collect_until
    from tests.sandboxes.test_event_stream import cookie_for

    provider = factories.make_provider(
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url=f"https://model.test:{PORTS.MODEL}",
        model_names=["scripted"],
    )  # fmt: skip
    upstream_fakes.model.script = [
        {"text": "Noted.", "tool_calls": [
            {"name": "write_file", "input": {"path": "plan.txt", "content": "step one"}},
        ]},
        {"text": "The plan is written."},
        {"text": "Still here: the plan says step one."},
    ]  # fmt: skip
    upstream_fakes.model.requests.clear()
    api = client_for(owner)
    created = api.post(
        "/api/v1/sessions/",
        {"prompt": "Remember the plan.", "model": f"{provider.pk}:scripted"},
        format="json",
    )
    session = Session.objects.get(pk=created.json()["id"])
    first = collect_until(cookie_for(owner), session, 0, lambda e: e["kind"] == "turn_finished")
    sleep(session.sandbox)

    api.post(f"/api/v1/sessions/{session.pk}/messages/", {"text": "And now?"}, format="json")
    after = first[-1]["seq"]
    second = collect_until(
        cookie_for(owner), session, after, lambda e: e["kind"] == "turn_finished"
    )
    said = [e["payload"].get("text", "") for e in second if e["kind"] == "assistant_text"]
    assert said == ["Still here: the plan says step one."]
    session.sandbox.refresh_from_db()
    assert session.sandbox.state == Sandbox.State.RUNNING
    # The model saw the whole conversation, restored from the sleeping workspace.
    messages = upstream_fakes.model.requests[-1]["body"]["messages"]
    texts = str(messages)
    assert "Remember the plan." in texts and "The plan is written." in texts
    assert "And now?" in texts
    listing = api.get(f"/api/v1/sessions/{session.pk}/files/content", {"path": "plan.txt"})
    assert b"".join(listing.streaming_content) == b"step one"


def test_the_operator_commands_sleep_and_wake_a_sandbox(owner, running_sandbox, session):
    import io

    from django.core.management import CommandError, call_command

    out = io.StringIO()
    call_command("sandbox_snapshot", owner.email, stdout=out)
    assert f"{running_sandbox.pk} sleeping: snapshot" in out.getvalue()
    with pytest.raises(CommandError, match="Nothing to snapshot: the sandbox is sleeping"):
        call_command("sandbox_snapshot", owner.email)
    out = io.StringIO()
    call_command("sandbox_restore", owner.email, stdout=out)
    assert f"{running_sandbox.pk} running: from snapshot" in out.getvalue()
    with pytest.raises(CommandError, match="is running, not sleeping"):
        call_command("sandbox_restore", owner.email)


@pytest.mark.parametrize("step", ["ensure", "import_workspace"])
def test_a_wake_that_fails_for_another_reason_stays_asleep_and_says_why(
    owner, running_sandbox, session, monkeypatch, step
):
    """The runtime will not start (an image gone, Docker restarting) or the archive will
    not unpack (a full disk): not the snapshot's fault."""
    from sandboxes.backends.base import BackendError

    before = run(running_sandbox, MANIFEST)
    snapshot = sleep(running_sandbox)

    def fails(self, *args):
        raise BackendError("No space left on device")

    monkeypatch.setattr(DockerBackend, step, fails)
    with pytest.raises(services.SandboxUnavailable, match="No space left"):
        services.sandbox_ensure_running(running_sandbox)
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.SLEEPING
    assert "No space left" in running_sandbox.failure_reason
    assert not DockerBackend().status(str(running_sandbox.pk)).exists
    snapshot.refresh_from_db()
    assert snapshot.status == Snapshot.Status.GOOD

    monkeypatch.undo()
    assert run(services.sandbox_ensure_running(running_sandbox), MANIFEST) == before


def test_a_failed_sandbox_with_only_its_snapshots_left_wakes_from_them(
    owner, running_sandbox, session
):
    before = run(running_sandbox, MANIFEST)
    sleep(running_sandbox)
    Sandbox.objects.filter(pk=running_sandbox.pk).update(state=Sandbox.State.FAILED)
    assert run(services.sandbox_ensure_running(running_sandbox), MANIFEST) == before


# Run as the sandbox user: a background job that keeps writing the same counter to two
# files (each replaced whole), `a-counter` then `z-counter`; the 3 MB `big.bin` lies between them in the
# archive, so an export reading them while the job runs finds them far apart.
COUNTERS = (
    'cd "$1" && setsid sh -c \'i=0; while true; do i=$((i+1)); '
    "echo $i > .a && mv .a a-counter; echo $i > .z && mv .z z-counter; done' "
    "> /dev/null 2>&1 < /dev/null & sleep 0.5"
)


def test_a_snapshot_is_the_workspace_at_one_instant_not_files_read_while_they_change(
    owner, running_sandbox, session
):
    directory = services.session_workspace(session)
    run(running_sandbox, COUNTERS, directory)
    sleep(running_sandbox)
    woken = services.sandbox_ensure_running(running_sandbox)
    first, second = (
        int(run(woken, f'cat "$1/{name}"', directory)) for name in ("a-counter", "z-counter")
    )
    assert first > 0
    assert second - first in (0, -1), (first, second)  # z is written right after a
    time.sleep(0.3)
    assert int(run(woken, 'cat "$1/a-counter"', directory)) == first  # the job is not restarted
