"""Running a command in a sandbox: the rules every backend shares.

A backend only knows how to start a command in one of its sandboxes (`Start`) and hand
back a running `Execution`: its stdin, its output as (stream, bytes) frames, its exit
code. Everything else lives here once: the `timeout` wrapper and what counts as timed
out, keeping the first bytes of each stream, and streaming stdout.
"""

import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from sandboxes.backends.base import BackendError, ExecResult

STDOUT, STDERR = 1, 2
TIMEOUT_EXIT = 124  # coreutils `timeout`: the command ran out of time (SIGTERM)
KILLED_EXIT = 137  # ... and ignored SIGTERM, so SIGKILL after the grace period
KILL_AFTER_S = 2
# How long a bounded command may stay silent past its own timeout before the reader
# gives up (the wrapper has killed it by then), and how long a streamed one may.
SILENCE_GRACE_S = 10
STREAM_SILENCE_S = 300
STREAM_STDERR_KEPT = 4096


class Execution(Protocol):
    """One command started in a sandbox."""

    def send_stdin(self, chunks: Iterable[bytes]) -> None:
        """Writes all of `chunks` to the command's stdin, then closes it."""

    def output(self, read_timeout: float) -> Iterator[tuple[int, bytes]]:
        """(STDOUT or STDERR, data) as the command writes it, until both are closed.
        Raises TimeoutError (an OSError) if nothing comes for `read_timeout` seconds."""

    def close(self) -> None:
        """Lets go of the command's stdio; the command itself runs on."""

    def exit_code(self) -> int:
        """The exit status once the command has ended (call after the output is read)."""


class Start(Protocol):
    """Starts argv (no shell) as the sandbox user in `cwd` with `env` added, with a
    stdin to send to if `stdin`. Raises RuntimeMissing if the sandbox has no running
    runtime, BackendUnavailable if its engine cannot be reached."""

    def __call__(
        self, argv: list[str], *, cwd: str, env: dict[str, str], stdin: bool
    ) -> Execution: ...


def with_timeout(argv: list[str], timeout_s: float) -> list[str]:
    """argv run by coreutils `timeout` in the sandbox: it signals the whole process
    group, so the command's children die too; SIGKILL follows SIGTERM after 2 s."""
    return ["timeout", f"--kill-after={KILL_AFTER_S}", f"{timeout_s:g}s", *argv]


def timed_out(exit_code: int, duration_s: float, timeout_s: float) -> bool:
    """Whether `timeout` ended the command: its exit status, and the time it took (the
    command could exit 124 or 137 by itself)."""
    return exit_code in (TIMEOUT_EXIT, KILLED_EXIT) and duration_s >= timeout_s


class BoundedOutput:
    """The first `limit` bytes of one stream, and whether more came."""

    def __init__(self, limit: int):
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = self.limit - len(self.data)
        if len(data) > room:
            self.truncated = True
        self.data.extend(data[: max(room, 0)])


def run_bounded(
    start: Start,
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout_s: float,
    output_limit: int,
    stdin: Iterable[bytes] | None = None,
) -> ExecResult:
    """SandboxBackend.exec for any backend: argv under `timeout`, at most
    `output_limit` bytes kept of stdout and of stderr."""
    started = time.monotonic()
    execution = start(with_timeout(argv, timeout_s), cwd=cwd, env=env, stdin=stdin is not None)
    kept = {STDOUT: BoundedOutput(output_limit), STDERR: BoundedOutput(output_limit)}
    try:
        if stdin is not None:
            execution.send_stdin(stdin)
        for stream, data in execution.output(timeout_s + SILENCE_GRACE_S):
            if stream in kept:
                kept[stream].add(data)
    finally:
        execution.close()
    exit_code = execution.exit_code()
    duration = time.monotonic() - started
    return ExecResult(
        exit_code=exit_code,
        stdout=bytes(kept[STDOUT].data),
        stderr=bytes(kept[STDERR].data),
        stdout_truncated=kept[STDOUT].truncated,
        stderr_truncated=kept[STDERR].truncated,
        timed_out=timed_out(exit_code, duration, timeout_s),
        duration_s=duration,
    )


def command_failed(exit_code: int, stderr: bytes) -> BackendError:
    return BackendError(f"command failed (exit {exit_code}): {stderr.decode(errors='replace')}")


def stream_stdout(
    start: Start,
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str] | None = None,
    failure: Callable[[int, bytes], BackendError] = command_failed,
) -> Iterator[bytes]:
    """SandboxBackend.exec_stream for any backend: stdout as it comes (no timeout
    wrapper, no bound); at the end, `failure(exit code, start of stderr)` is raised if
    the command failed. Nothing starts before the first item is asked for."""
    execution = start(argv, cwd=cwd, env=env or {}, stdin=False)
    stderr = bytearray()
    try:
        for stream, data in execution.output(STREAM_SILENCE_S):
            if stream == STDOUT:
                yield data
            elif len(stderr) < STREAM_STDERR_KEPT:
                stderr.extend(data)
    finally:
        execution.close()
    exit_code = execution.exit_code()
    if exit_code != 0:
        raise failure(exit_code, bytes(stderr))


def read_frames(sock) -> Iterator[tuple[int, bytes]]:
    """Frames of an 8-byte header (stream id, size), then data: Docker's multiplexed
    exec stream, and Quor's exec channel (channel.py)."""
    while True:
        header = read_exactly(sock, 8)
        if header is None:
            return
        stream_id, size = struct.unpack(">BxxxL", header)
        data = read_exactly(sock, size)
        if data is None:
            return
        yield stream_id, data


def read_exactly(sock, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def send_then_shut(sock, chunks: Iterable[bytes]) -> None:
    """Execution.send_stdin over a socket: every chunk, then the socket's sending side
    shut, which ends the command's stdin."""
    for chunk in chunks:
        sock.sendall(chunk)
    sock.shutdown(socket.SHUT_WR)
