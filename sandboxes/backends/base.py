"""The interface every sandbox backend implements, and the data it exchanges.

Callers outside sandboxes/backends/ use only this module's types, never an SDK. What
every backend does the same way lives once beside it: a command's time and output limits
(execution.py) and moving a workspace in and out as the sandbox user (transfer.py).
tests/sandboxes/backends/test_contract.py states what every backend must do.
"""

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from sandboxes.image import FS_HELPER, WORKSPACE


class BackendError(Exception):
    """A backend operation failed; the message is safe to show to an operator."""


class BackendUnavailable(BackendError):
    """The runtime (Docker Engine, the Kubernetes API) cannot be reached."""


class RuntimeMissing(BackendError):
    """The sandbox's runtime instance does not exist (or was removed behind our back)."""


class UnreadableFiles(BackendError):
    """The workspace holds files the sandbox user may not read (it took their permissions
    away): only the runtime's own archive can hold them."""


class StartUpChecks:
    """The servers that passed a backend's start-up check in this process: a backend
    is made for every operation, and making one does no I/O, so the check runs before
    the first call that needs it."""

    def __init__(self, passed: Iterable[str] = ()):
        self._passed = set(passed)
        self._lock = threading.Lock()

    def run_once(self, server: str, check: Callable[[], None]) -> None:
        with self._lock:
            if server in self._passed:
                return
        check()
        with self._lock:
            self._passed.add(server)


class UnsafeSandboxSpec(BackendError):
    """A spec asks for something a sandbox may never have."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("Refused sandbox spec: " + "; ".join(problems))


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox runtime instance should look like.

    The last four fields exist so that every caller, internal or public, goes
    through `validate_spec`: a sandbox is never privileged, never gets extra
    capabilities, host paths or the host's network.
    """

    sandbox_id: str
    image: str
    cpus: float
    memory_bytes: int
    pids_limit: int
    environment: dict[str, str] = field(default_factory=dict)
    privileged: bool = False
    extra_capabilities: tuple[str, ...] = ()
    host_mounts: tuple[str, ...] = ()
    host_network: bool = False


def validate_spec(spec: SandboxSpec) -> None:
    problems = []
    if spec.privileged:
        problems.append("privileged sandboxes are not allowed")
    if spec.extra_capabilities:
        problems.append(
            f"extra capabilities are not allowed ({', '.join(spec.extra_capabilities)})"
        )
    if spec.host_mounts:
        problems.append(f"host mounts are not allowed ({', '.join(spec.host_mounts)})")
    if spec.host_network:
        problems.append("host networking is not allowed")
    if spec.cpus <= 0 or spec.memory_bytes <= 0 or spec.pids_limit <= 0:
        problems.append("CPU, memory and pids limits must be positive")
    if problems:
        raise UnsafeSandboxSpec(problems)


@dataclass(frozen=True)
class RuntimeStatus:
    """A sandbox's runtime as its backend sees it. `network_address` is the sandbox's own
    address while it runs: the egress proxy sees the sandbox's traffic come from it (and
    knows the sandbox by it), and Quor reaches the sandbox's web apps and workspace
    transfers at it. Empty when the runtime does not run."""

    exists: bool
    running: bool = False
    runtime_id: str = ""
    image_ref: str = ""
    network_address: str = ""
    detail: str = ""


@dataclass(frozen=True)
class RuntimeInstance:
    """A runtime instance carrying this deployment's labels."""

    sandbox_id: str
    runtime_id: str
    running: bool


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_s: float


class Terminal:
    """An interactive command on a PTY in a sandbox, as the sandbox user: what the PTY
    sends, what is typed into it, its size. `read` blocks; `close` from another thread
    ends a read that waits."""

    def read(self) -> bytes:
        """The next bytes the PTY sent; b"" once the command ended or the terminal closed."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def resize(self, cols: int, rows: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def exit_code(self) -> int | None:
        """The command's exit status once it ended; None while it runs or if unknown."""
        raise NotImplementedError


class SandboxBackend:
    """A place where sandboxes run: each sandbox has at most one runtime (where its
    commands run, as the sandbox user, behind its firewall) and one workspace (its files
    at WORKSPACE, kept while the runtime is stopped or replaced). Everything is keyed by
    the sandbox id and scoped to this deployment."""

    name = ""

    def ping(self) -> None:
        """Raises BackendUnavailable when the runtime cannot be reached."""
        raise NotImplementedError

    def egress_proxy_address(self) -> str:
        """The address at which this backend's sandboxes reach the egress proxy."""
        raise NotImplementedError

    def egress_proxy_listen_address(self) -> str:
        """Where the egress proxy process binds: the address sandboxes reach, unless
        something routes that address to it (a Service in front of the proxy's pods).
        Sets up whatever the backend needs for that first."""
        return self.egress_proxy_address()

    def image_ref(self, image: str) -> str:
        """The id of the image a new runtime of `image` would run ("" if missing)."""
        raise NotImplementedError

    def ensure(self, spec: SandboxSpec) -> RuntimeStatus:
        """Creates the runtime if missing, starts it if stopped, and returns once its
        firewall is verified. Safe to call when it is already running."""
        raise NotImplementedError

    def stop(self, sandbox_id: str) -> None:
        """Stops the runtime, keeping its workspace. No error if it is absent. A backend
        whose runtimes cannot start again (a pod) removes it: ensure makes a new one."""
        raise NotImplementedError

    def destroy(self, sandbox_id: str, *, remove_workspace: bool) -> None:
        """Removes the runtime (and, when asked, its workspace). No error if absent."""
        raise NotImplementedError

    def status(self, sandbox_id: str) -> RuntimeStatus:
        """`exists=False` if the sandbox has no runtime."""
        raise NotImplementedError

    def list_instances(self) -> list[RuntimeInstance]:
        """This deployment's runtimes, running or stopped."""
        raise NotImplementedError

    def list_workspaces(self) -> list[str]:
        """Sandbox ids of this deployment's workspaces, whether or not a runtime uses them."""
        raise NotImplementedError

    def workspace_exists(self, sandbox_id: str) -> bool:
        raise NotImplementedError

    def exec(
        self,
        sandbox_id: str,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        timeout_s: float,
        output_limit: int,
        stdin: Iterable[bytes] | None = None,
    ) -> ExecResult:
        """Runs argv (no shell) as the sandbox user, bounded in time and output: killed with
        its children after `timeout_s` (timed_out), at most `output_limit` bytes kept of
        stdout and of stderr (truncated). Raises RuntimeMissing if no runtime runs."""
        raise NotImplementedError

    def exec_stream(self, sandbox_id: str, argv: list[str], *, cwd: str) -> Iterator[bytes]:
        """Runs argv as the sandbox user and yields its stdout as it comes.
        Raises BackendError at the end if the command failed."""
        raise NotImplementedError

    def open_terminal(
        self,
        sandbox_id: str,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        cols: int,
        rows: int,
    ) -> Terminal:
        """Starts argv on a PTY of `cols` x `rows` as the sandbox user. Raises
        RuntimeMissing if no runtime runs; a backend without terminals says so."""
        raise BackendError(f"Terminals need the Docker backend; this sandbox runs on {self.name}.")

    def export_workspace(self, sandbox_id: str, path: str = ".") -> Iterator[bytes]:
        """The workspace (or `path` in it) as an uncompressed tar stream, read with the
        runtime's privileges."""
        raise NotImplementedError

    def export_workspace_as_sandbox_user(
        self, sandbox_id: str, *, excluded: str
    ) -> Iterator[bytes]:
        """The workspace without `excluded` (a top-level name) as an uncompressed tar
        stream made by the sandbox user, with its processes stopped. Raises UnreadableFiles
        (at the end of the stream) if some file could not be read."""
        raise NotImplementedError

    def import_workspace(self, sandbox_id: str, tar_stream: Iterable[bytes]) -> None:
        """Puts a tar stream made by export_workspace back into the workspace."""
        raise NotImplementedError

    # File operations: the same for every backend, built on exec. The helper runs as
    # the sandbox user and refuses symlinks and '..' (deploy/sandbox/runtime/quor_fs.py).

    def _fs(self, sandbox_id, operation, root, relpath, *extra, stdin=None, output_limit=1 << 20):
        result = self.exec(
            sandbox_id,
            [*FS_HELPER, operation, root, relpath, *extra],
            cwd=WORKSPACE,
            env={},
            timeout_s=120,
            output_limit=output_limit,
            stdin=stdin,
        )
        return parse_fs_answer(result)

    def stat_path(self, sandbox_id: str, root: str, relpath: str) -> dict:
        return self._fs(sandbox_id, "stat", root, relpath)

    def list_files(self, sandbox_id: str, root: str, relpath: str) -> list[dict]:
        return self._fs(sandbox_id, "list", root, relpath, output_limit=16 << 20)["entries"]

    def write_file(
        self, sandbox_id: str, root: str, relpath: str, chunks: Iterable[bytes], size: int
    ) -> dict:
        """Writes exactly `size` bytes; anything else leaves the old file in place."""
        return self._fs(sandbox_id, "write", root, relpath, str(size), stdin=chunks)

    def read_file(self, sandbox_id: str, root: str, relpath: str) -> Iterator[bytes]:
        """Streams a regular file; call stat_path first to refuse bad paths cleanly."""
        return self.exec_stream(sandbox_id, [*FS_HELPER, "read", root, relpath], cwd=WORKSPACE)


class FileRefused(BackendError):
    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


def parse_fs_answer(result: ExecResult) -> dict:

    try:
        answer = json.loads(result.stdout.decode() or "null")
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "error" in answer:
        raise FileRefused(answer["error"]["code"], answer["error"]["message"])
    if result.exit_code != 0 or not isinstance(answer, dict):
        stderr = result.stderr.decode(errors="replace")[-500:]
        raise BackendError(f"file helper failed (exit {result.exit_code}): {stderr}")
    return answer
