"""What every sandbox backend must do, run against each one (conftest.ENGINES): the
in-memory one, and the Docker one against the real Docker Engine (`make test`). A new
backend (Kubernetes) joins by adding its engine there and passing every test here.

Tests that leave the sandbox running share one per backend (`shared`); the others start
their own (`fresh`). Each test works in a directory of its own in the shared workspace.
Sandbox paths are given as argv elements or cwd, never inside a shell script: the memory
backend maps only those onto its directories.
"""

import io
import tarfile
import uuid

import pytest

from sandboxes.backends.base import (
    BackendError,
    BackendUnavailable,
    FileRefused,
    RuntimeInstance,
    RuntimeMissing,
    UnreadableFiles,
    UnsafeSandboxSpec,
)
from sandboxes.image import WORKSPACE
from tests.sandboxes.backends.conftest import new_spec


def run(backend, sandbox_id, argv, **options):
    options = {"cwd": WORKSPACE, "env": {}, "timeout_s": 30, "output_limit": 1 << 20, **options}
    return backend.exec(sandbox_id, argv, **options)


def shell(backend, sandbox_id, script, **options):
    result = run(backend, sandbox_id, ["sh", "-c", script], **options)
    assert result.exit_code == 0, result.stderr
    return result


@pytest.fixture
def place(shared):
    """A new directory of this test's own in the shared workspace: its name."""
    backend, spec = shared
    name = f"t-{uuid.uuid4().hex[:12]}"
    assert run(backend, spec.sandbox_id, ["mkdir", f"/workspace/{name}"]).exit_code == 0
    return name


def names_in(archive: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {member.name.removeprefix("./") for member in tar.getmembers()} - {"."}


def first_file_in(archive: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = next(m for m in tar.getmembers() if m.isfile())
        return tar.extractfile(member).read()


# --- lifecycle ------------------------------------------------------------------------------


def test_ensure_gives_a_running_runtime_with_an_address_and_a_workspace(shared):
    backend, spec = shared
    status = backend.status(spec.sandbox_id)
    assert status.exists and status.running
    assert status.runtime_id and status.image_ref and status.network_address
    assert RuntimeInstance(spec.sandbox_id, status.runtime_id, True) in backend.list_instances()
    assert backend.workspace_exists(spec.sandbox_id)
    assert spec.sandbox_id in backend.list_workspaces()


def test_ensure_is_idempotent(shared):
    backend, spec = shared
    before = backend.status(spec.sandbox_id)
    again = backend.ensure(spec)
    assert again.runtime_id == before.runtime_id
    assert again.running
    ids = [i.sandbox_id for i in backend.list_instances()]
    assert ids.count(spec.sandbox_id) == 1


def test_stop_ends_every_process_keeps_the_workspace_and_ensure_starts_it_again(fresh):
    backend, spec = fresh()
    shell(backend, spec.sandbox_id, "echo kept > note.txt")
    marker = f"300.{uuid.uuid4().int % 10**9}"  # `sleep 300.<digits>`: ours alone
    shell(backend, spec.sandbox_id, f"sleep {marker} >/dev/null 2>&1 &")
    assert run(backend, spec.sandbox_id, ["pgrep", "-f", f"^sleep {marker}"]).exit_code == 0
    backend.stop(spec.sandbox_id)
    stopped = backend.status(spec.sandbox_id)
    assert not stopped.running and not stopped.network_address
    instances = [i for i in backend.list_instances() if i.sandbox_id == spec.sandbox_id]
    assert instances == (
        [RuntimeInstance(spec.sandbox_id, stopped.runtime_id, False)] if stopped.exists else []
    )
    assert backend.workspace_exists(spec.sandbox_id)
    with pytest.raises(RuntimeMissing):
        run(backend, spec.sandbox_id, ["true"])
    assert backend.ensure(spec).running
    assert run(backend, spec.sandbox_id, ["cat", "/workspace/note.txt"]).stdout == b"kept\n"
    assert run(backend, spec.sandbox_id, ["pgrep", "-f", f"^sleep {marker}"]).exit_code == 1


def test_destroy_can_keep_the_workspace_for_the_next_runtime(fresh):
    backend, spec = fresh()
    first = backend.status(spec.sandbox_id).runtime_id
    shell(backend, spec.sandbox_id, "echo kept > note.txt")
    backend.destroy(spec.sandbox_id, remove_workspace=False)
    assert not backend.status(spec.sandbox_id).exists
    assert spec.sandbox_id not in [i.sandbox_id for i in backend.list_instances()]
    assert backend.workspace_exists(spec.sandbox_id)
    assert spec.sandbox_id in backend.list_workspaces()
    with pytest.raises(RuntimeMissing):
        run(backend, spec.sandbox_id, ["true"])
    assert backend.ensure(spec).runtime_id != first
    assert run(backend, spec.sandbox_id, ["cat", "/workspace/note.txt"]).stdout == b"kept\n"


def test_destroy_with_the_workspace_leaves_nothing_and_the_next_runtime_starts_empty(fresh):
    backend, spec = fresh()
    shell(backend, spec.sandbox_id, "echo gone > note.txt")
    backend.destroy(spec.sandbox_id, remove_workspace=True)
    assert not backend.status(spec.sandbox_id).exists
    assert spec.sandbox_id not in [i.sandbox_id for i in backend.list_instances()]
    assert not backend.workspace_exists(spec.sandbox_id)
    assert spec.sandbox_id not in backend.list_workspaces()
    backend.ensure(spec)
    assert run(backend, spec.sandbox_id, ["test", "-e", "/workspace/note.txt"]).exit_code == 1


def test_stop_destroy_and_status_of_a_sandbox_without_a_runtime_are_harmless(engine):
    backend, sandbox_id = engine.backend(), str(uuid.uuid4())
    backend.stop(sandbox_id)
    backend.destroy(sandbox_id, remove_workspace=False)
    backend.destroy(sandbox_id, remove_workspace=True)
    assert not backend.status(sandbox_id).exists
    assert not backend.workspace_exists(sandbox_id)


@pytest.mark.parametrize(
    "unsafe",
    [
        {"privileged": True},
        {"extra_capabilities": ("SYS_ADMIN",)},
        {"host_mounts": ("/var/run/docker.sock",)},
        {"host_network": True},
    ],
)
def test_an_unsafe_spec_is_refused_before_anything_exists(engine, unsafe):
    backend, spec = engine.backend(), new_spec(**unsafe)
    with pytest.raises(UnsafeSandboxSpec):
        backend.ensure(spec)
    assert not backend.status(spec.sandbox_id).exists
    assert not backend.workspace_exists(spec.sandbox_id)


def test_a_runtime_removed_behind_quors_back_is_missing_and_its_workspace_kept(engine, fresh):
    backend, spec = fresh()
    engine.lose_runtime(spec.sandbox_id)
    assert not backend.status(spec.sandbox_id).exists
    with pytest.raises(RuntimeMissing):
        run(backend, spec.sandbox_id, ["true"])
    assert backend.workspace_exists(spec.sandbox_id)


def test_every_command_on_a_sandbox_without_a_runtime_raises_runtime_missing(engine):
    backend, sandbox_id = engine.backend(), str(uuid.uuid4())
    with pytest.raises(RuntimeMissing):
        run(backend, sandbox_id, ["true"])
    with pytest.raises(RuntimeMissing):
        list(backend.exec_stream(sandbox_id, ["true"], cwd=WORKSPACE))
    with pytest.raises(RuntimeMissing):
        backend.stat_path(sandbox_id, WORKSPACE, "")
    with pytest.raises(RuntimeMissing):
        list(backend.export_workspace(sandbox_id))
    with pytest.raises(RuntimeMissing):
        list(backend.export_workspace_as_sandbox_user(sandbox_id, excluded=".quor-managed"))
    with pytest.raises(RuntimeMissing):
        backend.import_workspace(sandbox_id, [b""])


def test_every_operation_on_an_unreachable_engine_raises_backend_unavailable(engine, monkeypatch):
    sandbox_id = str(uuid.uuid4())
    operations = {
        "ping": lambda b: b.ping(),
        # Docker's address is known from the settings; it binds once its bridge exists
        "egress_proxy_addresses": lambda b: (
            b.egress_proxy_address(),
            b.egress_proxy_listen_address(),
        ),
        "ensure": lambda b: b.ensure(new_spec()),
        "status": lambda b: b.status(sandbox_id),
        "stop": lambda b: b.stop(sandbox_id),
        "destroy": lambda b: b.destroy(sandbox_id, remove_workspace=True),
        "list_instances": lambda b: b.list_instances(),
        "list_workspaces": lambda b: b.list_workspaces(),
        "workspace_exists": lambda b: b.workspace_exists(sandbox_id),
        "exec": lambda b: run(b, sandbox_id, ["true"]),
        "exec_stream": lambda b: list(b.exec_stream(sandbox_id, ["true"], cwd=WORKSPACE)),
        "import_workspace": lambda b: b.import_workspace(sandbox_id, [b""]),
    }
    for name, operation in operations.items():
        with pytest.raises(BackendUnavailable):
            operation(engine.unreachable_backend(monkeypatch))
            pytest.fail(f"{name} did not raise BackendUnavailable")


# --- exec -----------------------------------------------------------------------------------


def test_exec_takes_argv_without_a_shell(shared):
    backend, spec = shared
    result = run(backend, spec.sandbox_id, ["echo", "$HOME; touch /workspace/pwned"])
    assert result.stdout == b"$HOME; touch /workspace/pwned\n"
    assert run(backend, spec.sandbox_id, ["test", "-e", "/workspace/pwned"]).exit_code == 1


def test_commands_run_as_the_sandbox_user(engine, shared):
    if not engine.runs_as_sandbox_user:
        pytest.skip("the memory backend runs commands as the sandbox user only as root")
    backend, spec = shared
    assert run(backend, spec.sandbox_id, ["id", "-u"]).stdout == b"1000\n"
    assert run(backend, spec.sandbox_id, ["id", "-g"]).stdout == b"1000\n"


def test_exec_runs_in_the_given_directory_with_the_given_environment(shared, place):
    backend, spec = shared
    shell(
        backend, spec.sandbox_id, 'echo "$GREETING" > here.txt',
        cwd=f"/workspace/{place}", env={"GREETING": "hello there"},
    )  # fmt: skip
    here = run(backend, spec.sandbox_id, ["cat", f"/workspace/{place}/here.txt"])
    assert here.stdout == b"hello there\n"


def test_exec_reports_the_exit_code_stderr_and_duration(shared):
    backend, spec = shared
    code = "import sys; sys.stderr.write('oops'); sys.exit(3)"
    result = run(backend, spec.sandbox_id, ["python3", "-c", code])
    assert result.exit_code == 3
    assert result.stdout == b""
    assert result.stderr == b"oops"
    assert not result.timed_out
    assert 0 < result.duration_s < 10


def test_exec_feeds_stdin_to_the_command(shared):
    backend, spec = shared
    result = run(backend, spec.sandbox_id, ["cat"], stdin=iter([b"one ", b"two"]))
    assert result.stdout == b"one two"
    assert result.exit_code == 0


@pytest.mark.parametrize(("loud", "quiet"), [("stdout", "stderr"), ("stderr", "stdout")])
def test_output_past_the_limit_is_cut_and_flagged_per_stream(shared, loud, quiet):
    backend, spec = shared
    code = f"import sys; sys.{loud}.write('x' * 500000); sys.{quiet}.write('y' * 10)"
    result = run(backend, spec.sandbox_id, ["python3", "-c", code], output_limit=1000)
    assert getattr(result, loud) == b"x" * 1000
    assert getattr(result, f"{loud}_truncated") is True
    assert getattr(result, quiet) == b"y" * 10
    assert getattr(result, f"{quiet}_truncated") is False
    assert result.exit_code == 0


def test_a_command_past_its_timeout_is_killed_with_its_children(shared):
    backend, spec = shared
    marker = f"60.{uuid.uuid4().int % 10**9}"  # `sleep 60.<digits>`: ours alone
    result = run(backend, spec.sandbox_id, ["sh", "-c", f"sleep {marker} & sleep {marker}"],
                 timeout_s=1)  # fmt: skip
    assert result.timed_out is True
    assert result.exit_code in (124, 137)
    assert 1 <= result.duration_s < 6
    leftovers = run(backend, spec.sandbox_id, ["pgrep", "-f", f"^sleep {marker}"])
    assert leftovers.exit_code == 1, leftovers.stdout


def test_a_command_that_exits_124_by_itself_has_not_timed_out(shared):
    backend, spec = shared
    result = run(backend, spec.sandbox_id, ["sh", "-c", "exit 124"], timeout_s=30)
    assert result.exit_code == 124
    assert result.timed_out is False


def test_exec_stream_yields_stdout_as_it_comes_and_fails_at_the_end(shared):
    backend, spec = shared
    argv = ["sh", "-c", "echo out; echo err >&2"]
    assert b"".join(backend.exec_stream(spec.sandbox_id, argv, cwd=WORKSPACE)) == b"out\n"
    stream = backend.exec_stream(
        spec.sandbox_id, ["sh", "-c", "echo partial; echo why >&2; exit 3"], cwd=WORKSPACE
    )
    assert next(stream) == b"partial\n"
    with pytest.raises(BackendError, match=r"exit 3\).*why"):
        list(stream)


# --- files ----------------------------------------------------------------------------------


def test_files_are_written_stated_listed_and_read_back(shared, place):
    backend, spec = shared
    sid = spec.sandbox_id
    written = backend.write_file(sid, WORKSPACE, f"{place}/hello.txt", iter([b"hel", b"lo"]), 5)
    assert written == {"name": "hello.txt", "size": 5}
    stat = backend.stat_path(sid, WORKSPACE, f"{place}/hello.txt")
    assert (stat["name"], stat["type"], stat["size"]) == ("hello.txt", "file", 5)
    assert backend.stat_path(sid, WORKSPACE, place)["type"] == "directory"
    listed = backend.list_files(sid, WORKSPACE, place)
    assert [(e["name"], e["type"], e["size"]) for e in listed] == [("hello.txt", "file", 5)]
    assert b"".join(backend.read_file(sid, WORKSPACE, f"{place}/hello.txt")) == b"hello"
    owner = run(backend, sid, ["stat", "-c", "%u %a", f"/workspace/{place}/hello.txt"])
    assert owner.stdout.split()[1] == b"644"


def test_a_write_of_another_size_than_announced_keeps_the_old_file(shared, place):
    backend, spec = shared
    sid, path = spec.sandbox_id, f"{place}/kept.txt"
    backend.write_file(sid, WORKSPACE, path, [b"old"], 3)
    with pytest.raises(FileRefused) as refused:
        backend.write_file(sid, WORKSPACE, path, [b"new but longer"], 3)
    assert refused.value.code == "files.incomplete_upload"
    assert b"".join(backend.read_file(sid, WORKSPACE, path)) == b"old"
    assert [e["name"] for e in backend.list_files(sid, WORKSPACE, place)] == ["kept.txt"]


def test_a_missing_file_is_not_found(shared, place):
    backend, spec = shared
    with pytest.raises(FileRefused) as refused:
        backend.stat_path(spec.sandbox_id, WORKSPACE, f"{place}/nothing.txt")
    assert refused.value.code == "files.not_found"


@pytest.mark.parametrize("path", ["../etc/passwd", "a/../../etc/passwd", "/etc/passwd"])
def test_paths_that_could_leave_the_workspace_are_refused(shared, path):
    backend, spec = shared
    with pytest.raises(FileRefused) as refused:
        backend.stat_path(spec.sandbox_id, WORKSPACE, path)
    assert refused.value.code == "files.invalid_path"
    with pytest.raises(FileRefused) as refused:
        backend.write_file(spec.sandbox_id, WORKSPACE, path, [b"x"], 1)
    assert refused.value.code == "files.invalid_path"


def test_symlinks_are_refused_anywhere_in_the_path(shared, place):
    backend, spec = shared
    sid = spec.sandbox_id
    shell(backend, sid, "echo mine > target.txt && ln -s /etc link && ln -s target.txt alias",
          cwd=f"/workspace/{place}")  # fmt: skip
    refusals = [
        lambda: backend.stat_path(sid, WORKSPACE, f"{place}/link/passwd"),
        lambda: backend.list_files(sid, WORKSPACE, f"{place}/link"),
        lambda: backend.stat_path(sid, f"/workspace/{place}/link", "passwd"),
        lambda: backend.write_file(sid, WORKSPACE, f"{place}/alias", [b"theirs"], 6),
        lambda: backend.write_file(sid, WORKSPACE, f"{place}/link/evil", [b"x"], 1),
    ]
    for refusal in refusals:
        with pytest.raises(FileRefused) as refused:
            refusal()
        assert refused.value.code == "files.symlink_refused"
    assert b"".join(backend.read_file(sid, WORKSPACE, f"{place}/target.txt")) == b"mine\n"


# --- workspace export and import ------------------------------------------------------------

WORKSPACE_FILES = """
mkdir -p dir/sub .quor-managed
printf data > dir/sub/file.txt
printf '#!/bin/sh\\necho ran\\n' > tool.sh && chmod 755 tool.sh
printf secret > private.txt && chmod 600 private.txt
echo managed > .quor-managed/skill.txt
"""


def test_a_workspace_exported_by_the_sandbox_user_comes_back_with_its_files_and_modes(fresh):
    backend, source = fresh()
    _, target = fresh()
    shell(backend, source.sandbox_id, WORKSPACE_FILES)
    archive = b"".join(
        backend.export_workspace_as_sandbox_user(source.sandbox_id, excluded=".quor-managed")
    )
    names = names_in(archive)
    assert {"dir", "dir/sub", "dir/sub/file.txt", "tool.sh", "private.txt"} <= names
    assert not [name for name in names if name.startswith(".quor-managed")]
    backend.import_workspace(
        target.sandbox_id, [archive[i : i + 1000] for i in range(0, len(archive), 1000)]
    )
    sid = target.sandbox_id
    assert run(backend, sid, ["cat", "/workspace/dir/sub/file.txt"]).stdout == b"data"
    assert run(backend, sid, ["/workspace/tool.sh"]).stdout == b"ran\n"
    modes = run(backend, sid, ["stat", "-c", "%a %n", "tool.sh", "private.txt", "dir/sub"])
    assert modes.stdout.decode().split("\n")[:3] == [
        "755 tool.sh",
        "600 private.txt",
        "755 dir/sub",
    ]
    assert run(backend, sid, ["test", "-e", "/workspace/.quor-managed"]).exit_code == 1


def test_the_runtimes_own_export_holds_what_the_sandbox_user_cannot_read(engine, shared, place):
    if not engine.runs_as_sandbox_user:
        pytest.skip("the memory backend reads as another user than its commands only as root")
    backend, spec = shared
    sid = spec.sandbox_id
    shell(
        backend,
        sid,
        "printf locked > locked.txt && chmod 000 locked.txt",
        cwd=f"/workspace/{place}",
    )
    try:
        with pytest.raises(UnreadableFiles, match="Permission denied"):
            list(backend.export_workspace_as_sandbox_user(sid, excluded=".quor-managed"))
        assert f"{place}/locked.txt" in names_in(b"".join(backend.export_workspace(sid)))
        one_file = b"".join(backend.export_workspace(sid, f"{place}/locked.txt"))
        assert first_file_in(one_file) == b"locked"
    finally:
        run(backend, sid, ["chmod", "644", f"/workspace/{place}/locked.txt"])


def test_an_archive_tar_refuses_is_a_backend_error_with_tars_message(shared):
    backend, spec = shared
    with pytest.raises(
        BackendError, match=r"tar in the sandbox failed.*does not look like a tar archive"
    ):
        backend.import_workspace(spec.sandbox_id, [b"not a tar archive\n" * 2000])
