"""The mechanics every backend shares (execution.py, transfer.py), without a sandbox
where a fake exec will do, and the transfer protocol over another exec than Docker's."""

import contextlib
import io
import os
import socket
import tarfile

import pytest

from sandboxes.backends import execution, transfer
from sandboxes.backends.base import BackendError
from sandboxes.backends.execution import STDERR, STDOUT, BoundedOutput
from sandboxes.backends.memory import MemoryBackend
from sandboxes.image import WORKSPACE
from tests.sandboxes.backends.conftest import new_spec


class FakeExecution:
    def __init__(self, frames, exit_code=0, stalls=False):
        self.frames, self.code, self.stalls = frames, exit_code, stalls
        self.stdin, self.closed = None, False

    def send_stdin(self, chunks):
        self.stdin = b"".join(chunks)

    def output(self, read_timeout):
        self.read_timeout = read_timeout
        yield from self.frames
        if self.stalls:
            raise TimeoutError("silent")

    def close(self):
        self.closed = True

    def exit_code(self):
        return self.code


class FakeStart:
    def __init__(self, execution):
        self.execution, self.calls = execution, []

    def __call__(self, argv, *, cwd, env, stdin):
        self.calls.append((argv, cwd, env, stdin))
        return self.execution


def test_commands_run_under_timeout_which_kills_their_group_after_a_grace_period():
    assert execution.with_timeout(["sleep", "9"], 1.5) == [
        "timeout", "--kill-after=2", "1.5s", "sleep", "9",
    ]  # fmt: skip
    assert execution.with_timeout(["true"], 3600)[2] == "3600s"


@pytest.mark.parametrize(
    ("exit_code", "duration", "expected"),
    [(124, 1.0, True), (137, 3.1, True), (124, 0.2, False), (137, 0.5, False), (1, 5.0, False)],
)
def test_a_command_timed_out_only_if_timeout_ended_it_after_its_time(exit_code, duration, expected):
    assert execution.timed_out(exit_code, duration, timeout_s=1.0) is expected


def test_bounded_output_keeps_the_first_bytes_and_says_more_came():
    kept = BoundedOutput(5)
    for piece in (b"abc", b"de", b""):
        kept.add(piece)
    assert (bytes(kept.data), kept.truncated) == (b"abcde", False)
    kept.add(b"f")
    assert (bytes(kept.data), kept.truncated) == (b"abcde", True)


def test_run_bounded_sends_stdin_bounds_each_stream_and_closes_the_execution():
    fake = FakeExecution([(STDOUT, b"o" * 8), (STDERR, b"e" * 3), (3, b"ignored")], 2)
    start = FakeStart(fake)
    result = execution.run_bounded(
        start, ["cmd"], cwd="/workspace/x", env={"A": "1"}, timeout_s=5, output_limit=4,
        stdin=[b"in", b"put"],
    )  # fmt: skip
    assert start.calls == [
        (["timeout", "--kill-after=2", "5s", "cmd"], "/workspace/x", {"A": "1"}, True)
    ]
    assert fake.stdin == b"input"
    assert fake.read_timeout == 5 + execution.SILENCE_GRACE_S
    assert (result.stdout, result.stdout_truncated) == (b"oooo", True)
    assert (result.stderr, result.stderr_truncated) == (b"eee", False)
    assert (result.exit_code, result.timed_out) == (2, False)
    assert fake.closed


def test_a_silent_command_is_given_up_and_its_execution_closed_all_the_same():
    fake = FakeExecution([(STDOUT, b"partial")], stalls=True)
    with pytest.raises(TimeoutError):
        execution.run_bounded(
            FakeStart(fake), ["cmd"], cwd="/", env={}, timeout_s=1, output_limit=9
        )
    assert fake.closed


def test_stream_stdout_starts_nothing_before_it_is_read_and_raises_the_backends_failure():
    start = FakeStart(FakeExecution([(STDOUT, b"a"), (STDERR, b"why"), (STDOUT, b"b")], 3))
    stream = execution.stream_stdout(
        start, ["cmd"], cwd="/", failure=lambda c, e: BackendError(f"{c} {e!r}")
    )
    assert start.calls == []
    assert next(stream) == b"a"
    assert next(stream) == b"b"
    with pytest.raises(BackendError, match=r"3 b'why'"):
        next(stream)
    assert start.execution.closed


# --- the transfer protocol over the memory backend's exec -------------------------------------


@pytest.fixture
def memory_sandbox():
    """A memory sandbox and its address. The transfer scripts keep tar's errors in
    /tmp/.quor-tar.err, here the host's: removed after the test."""
    backend, spec = MemoryBackend(), new_spec()
    status = backend.ensure(spec)
    yield backend, spec.sandbox_id, status.network_address
    backend.destroy(spec.sandbox_id, remove_workspace=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink("/tmp/.quor-tar.err")


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o640
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_the_transfer_protocol_works_over_any_backends_exec(memory_sandbox):
    backend, sandbox_id, address = memory_sandbox
    start = backend._starter(sandbox_id)
    transfer.receive_workspace(start, address, [tar_of({"a.txt": b"alpha", "b/c.txt": b"gamma"})])
    assert backend.exec(sandbox_id, ["cat", "/workspace/b/c.txt"], cwd=WORKSPACE, env={},
                        timeout_s=10, output_limit=100).stdout == b"gamma"  # fmt: skip
    archive = b"".join(transfer.send_workspace(start, address, excluded="b"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = {m.name for m in tar.getmembers()}
        assert tar.extractfile("./a.txt").read() == b"alpha"
        assert oct(tar.getmember("./a.txt").mode) == oct(0o640)
    assert "./b" not in names
    assert "./b/c.txt" not in names


def test_a_transfer_that_tar_refuses_raises_tars_message(memory_sandbox):
    backend, sandbox_id, address = memory_sandbox
    with pytest.raises(BackendError, match=r"tar in the sandbox failed.*does not look like a tar"):
        transfer.receive_workspace(backend._starter(sandbox_id), address, [b"no tar" * 5000])


def test_the_receiver_takes_no_connection_without_its_token(memory_sandbox):
    backend, sandbox_id, address = memory_sandbox
    started = backend._starter(sandbox_id)(
        ["python3", "-c", transfer.RECEIVE_AND_UNPACK, "a" * 32, WORKSPACE],
        cwd=WORKSPACE, env={}, stdin=False,
    )  # fmt: skip
    output = {STDOUT: bytearray(), STDERR: bytearray()}
    try:
        frames = started.output(30)
        port = int(transfer.first_line(frames, output))
        with socket.create_connection((address, port), timeout=10) as intruder:
            intruder.sendall(b"b" * 32 + tar_of({"planted.txt": b"planted"}))
            with contextlib.suppress(ConnectionResetError):
                while intruder.recv(65536):
                    pass
        for stream, data in frames:
            output[stream].extend(data)
    finally:
        started.close()
    assert started.exit_code() != 0
    assert b"without the token" in output[STDERR]
    listing = backend.list_files(sandbox_id, WORKSPACE, "")
    assert "planted.txt" not in [entry["name"] for entry in listing]
