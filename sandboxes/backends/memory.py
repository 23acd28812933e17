"""Sandboxes as processes of this host, kept in this process's memory. For tests only:
it isolates nothing.

A sandbox's runtime is an entry in a registry shared by every MemoryBackend of the
process, its workspace a temporary directory. A command is a process of this host: as
the sandbox user (uid 1000) when Quor runs as root, else as Quor's own user; with the
host's network, processes and files in reach, no firewall, no CPU, memory or process
limits, and every sandbox on the same ports. Paths the sandbox knows are mapped onto its
directories: an argv element, an environment value or the cwd that is or lies under
/workspace, /home/sandbox or /opt/quor (the in-sandbox runtime, deploy/sandbox/runtime/)
names the sandbox's own copy instead; a path inside a longer string (`sh -c "cat
/workspace/x"`) is not rewritten, and commands see the host's other paths (/tmp
included). Time and output limits are every backend's (execution.py); workspaces go out
and in as tar streams made and unpacked by `tar` as the sandbox user (the runtime's own
archive by Quor's user). Each running sandbox gets its own loopback address.

Start-up refuses QUOR_SANDBOX_BACKEND=memory unless QUOR_DEBUG (quor.E006). Tests make the
engine unreachable with `MemoryBackend.unreachable = True`, lose a runtime behind Quor's
back with `MemoryBackend.lose_runtime(sandbox_id)`, and start afresh with `reset()`.
"""

import contextlib
import ipaddress
import itertools
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sandboxes.backends.base import (
    BackendError,
    BackendUnavailable,
    ExecResult,
    RuntimeInstance,
    RuntimeMissing,
    RuntimeStatus,
    SandboxBackend,
    SandboxSpec,
    validate_spec,
)
from sandboxes.backends.execution import (
    STDERR,
    STDOUT,
    Execution,
    Start,
    run_bounded,
    stream_stdout,
)
from sandboxes.backends.transfer import (
    ERRORS_KEPT,
    TRANSFER_TIMEOUT_S,
    tar_failed,
    unreadable_if_denied,
)
from sandboxes.image import SANDBOX_UID, WORKSPACE

RUNTIME_FILES = Path(__file__).resolve().parents[2] / "deploy" / "sandbox" / "runtime"
HOME = "/home/sandbox"
OPT = "/opt/quor"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FIRST_ADDRESS = ipaddress.ip_address("127.42.0.1")
EGRESS_PROXY_ADDRESS = "127.0.0.1"


@dataclass
class _Runtime:
    runtime_id: str
    spec: SandboxSpec
    root: Path  # home/, tmp/ and opt/quor/ of this runtime
    address: str
    running: bool = True
    # Every command starts a session of its own (its id, the command's pid, is also its
    # process group's): what it leaves running in the background stays in it.
    sessions: set[int] = field(default_factory=set)

    def kill_processes(self) -> None:
        for session in self.sessions:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(session, signal.SIGKILL)
        self.sessions = set()

    def add_session(self, session: int) -> None:
        self.sessions = {s for s in self.sessions if _group_alive(s)} | {session}


class MemoryBackend(SandboxBackend):
    name = "memory"
    unreachable = False  # True: the engine cannot be reached (BackendUnavailable)

    _runtimes: ClassVar[dict[str, _Runtime]] = {}
    _workspaces: ClassVar[dict[str, Path]] = {}
    _lock = threading.RLock()
    _addresses = itertools.count()

    def __init__(self, *, unreachable: bool | None = None):
        if unreachable is not None:
            self.unreachable = unreachable
        self._engine()

    # --- for tests ---------------------------------------------------------------------

    @classmethod
    def lose_runtime(cls, sandbox_id: str, *, with_workspace: bool = False) -> None:
        """The runtime disappears as if removed behind Quor's back (an operator, a host
        restart); its processes are killed."""
        with cls._lock:
            runtime = cls._runtimes.pop(sandbox_id, None)
            workspace = cls._workspaces.pop(sandbox_id, None) if with_workspace else None
        if runtime is not None:
            runtime.kill_processes()
            shutil.rmtree(runtime.root, ignore_errors=True)
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)

    @classmethod
    def reset(cls) -> None:
        """Every runtime and workspace removed, the engine reachable."""
        for sandbox_id in list(cls._runtimes) + list(cls._workspaces):
            cls.lose_runtime(sandbox_id, with_workspace=True)
        cls.unreachable = False

    # --- runtime -----------------------------------------------------------------------

    def _engine(self) -> None:
        if self.unreachable:
            raise BackendUnavailable("the memory backend's engine is not reachable (a test)")

    def ping(self) -> None:
        self._engine()

    def egress_proxy_address(self) -> str:
        """Loopback: sandboxes are processes of this host."""
        self._engine()
        return EGRESS_PROXY_ADDRESS

    def image_ref(self, image: str) -> str:
        self._engine()
        return f"memory:{image}"

    def ensure(self, spec: SandboxSpec) -> RuntimeStatus:
        validate_spec(spec)
        self._engine()
        with self._lock:
            if spec.sandbox_id not in self._workspaces:
                self._workspaces[spec.sandbox_id] = _new_workspace()
            runtime = self._runtimes.get(spec.sandbox_id)
            if runtime is None:
                runtime = self._runtimes[spec.sandbox_id] = _new_runtime(spec)
            runtime.running = True
            return self._status_of(runtime)

    def _status_of(self, runtime: _Runtime) -> RuntimeStatus:
        return RuntimeStatus(
            exists=True,
            running=runtime.running,
            runtime_id=runtime.runtime_id,
            image_ref=f"memory:{runtime.spec.image}",
            network_address=runtime.address if runtime.running else "",
            detail="running" if runtime.running else "stopped",
        )

    def status(self, sandbox_id: str) -> RuntimeStatus:
        self._engine()
        with self._lock:
            runtime = self._runtimes.get(sandbox_id)
            if runtime is None:
                return RuntimeStatus(exists=False, detail="absent")
            return self._status_of(runtime)

    def stop(self, sandbox_id: str) -> None:
        self._engine()
        with self._lock:
            runtime = self._runtimes.get(sandbox_id)
            if runtime is None:
                return
            runtime.running = False
        runtime.kill_processes()

    def destroy(self, sandbox_id: str, *, remove_workspace: bool) -> None:
        self._engine()
        self.lose_runtime(sandbox_id, with_workspace=remove_workspace)

    def list_instances(self) -> list[RuntimeInstance]:
        self._engine()
        with self._lock:
            return [
                RuntimeInstance(sandbox_id=sandbox_id, runtime_id=r.runtime_id, running=r.running)
                for sandbox_id, r in self._runtimes.items()
            ]

    def list_workspaces(self) -> list[str]:
        self._engine()
        with self._lock:
            return list(self._workspaces)

    def workspace_exists(self, sandbox_id: str) -> bool:
        self._engine()
        with self._lock:
            return sandbox_id in self._workspaces

    # --- exec --------------------------------------------------------------------------

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
        return run_bounded(
            self._starter(sandbox_id),
            argv,
            cwd=cwd,
            env=env,
            timeout_s=timeout_s,
            output_limit=output_limit,
            stdin=stdin,
        )

    def exec_stream(self, sandbox_id: str, argv: list[str], *, cwd: str) -> Iterator[bytes]:
        yield from stream_stdout(self._starter(sandbox_id), argv, cwd=cwd)

    def _starter(self, sandbox_id: str) -> Start:
        """Starts commands in the sandbox as the sandbox user (execution.Start)."""

        def start(argv, *, cwd, env, stdin) -> Execution:
            self._engine()
            with self._lock:
                runtime = self._runtimes.get(sandbox_id)
                if runtime is None or not runtime.running:
                    raise RuntimeMissing(f"sandbox {sandbox_id} has no running runtime")
                places = {
                    WORKSPACE: str(self._workspaces[sandbox_id]),
                    HOME: str(runtime.root / "home"),
                    OPT: str(runtime.root / "opt" / "quor"),
                }
            environment = {
                "PATH": PATH,
                "LANG": "C.UTF-8",
                **runtime.spec.environment,
                "HOME": HOME,
                "TMPDIR": str(runtime.root / "tmp"),
                **env,
            }
            execution = _start_process(
                [_on_host(arg, places) for arg in argv],
                cwd=_on_host(cwd, places),
                env={name: _on_host(value, places) for name, value in environment.items()},
                stdin=stdin,
                as_sandbox_user=True,
            )
            if execution.process is not None:
                with self._lock:
                    runtime.add_session(execution.process.pid)
            return execution

        return start

    # --- workspace streams ---------------------------------------------------------------

    def export_workspace(self, sandbox_id: str, path: str = ".") -> Iterator[bytes]:
        """Read by Quor's user, as a runtime reads its own files; the runtime may be
        stopped. A path that leaves the workspace is refused."""
        self._engine()
        with self._lock:
            if sandbox_id not in self._runtimes:
                raise RuntimeMissing(f"sandbox {sandbox_id} has no runtime")
            workspace = self._workspaces[sandbox_id]
        target = Path(os.path.normpath(workspace / path))
        if target != workspace and workspace not in target.parents:
            raise BackendError(f"{path} is outside the workspace")

        def start(argv, *, cwd, env, stdin) -> Execution:
            return _start_process(argv, cwd=cwd, env={"PATH": PATH}, stdin=False)

        argv = ["tar", "-c", "-C", str(target.parent), "-f", "-", target.name]
        if target == workspace:
            argv = ["tar", "-c", "-C", str(workspace), "-f", "-", "."]
        return stream_stdout(start, argv, cwd=str(workspace), failure=tar_failed)

    def export_workspace_as_sandbox_user(
        self, sandbox_id: str, *, excluded: str
    ) -> Iterator[bytes]:
        exclude = f"--exclude=./{excluded}"  # as transfer.SEND_ARCHIVE
        argv = ["tar", "-c", "--anchored", exclude, "-C", WORKSPACE, "-f", "-", "."]
        yield from stream_stdout(
            self._starter(sandbox_id),
            argv,
            cwd=WORKSPACE,
            failure=lambda code, stderr: unreadable_if_denied(tar_failed(code, stderr)),
        )

    def import_workspace(self, sandbox_id: str, tar_stream: Iterable[bytes]) -> None:
        result = self.exec(
            sandbox_id,
            ["tar", "-x", "-p", "--no-same-owner", "-C", WORKSPACE, "-f", "-"],
            cwd=WORKSPACE,
            env={},
            timeout_s=TRANSFER_TIMEOUT_S,
            output_limit=ERRORS_KEPT,
            stdin=tar_stream,
        )
        if result.exit_code != 0:
            raise tar_failed(result.exit_code, result.stderr)


def _on_host(value: str, places: dict[str, str]) -> str:
    """`value` with a sandbox path's start replaced by the sandbox's directory on the host."""
    for inside, outside in places.items():
        if value == inside or value.startswith(inside + "/"):
            return outside + value[len(inside) :]
    return value


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _as_root() -> bool:
    return os.geteuid() == 0


def _new_directory(kind: str, mode: int, *, owned: bool) -> Path:
    """A new directory (no symlink in its path: the file helper refuses them), owned by
    the sandbox user if `owned` and Quor runs as root."""
    path = Path(tempfile.mkdtemp(prefix=f"quor-memory-{kind}-")).resolve()
    path.chmod(mode)
    if owned and _as_root():
        os.chown(path, SANDBOX_UID, SANDBOX_UID)
    return path


def _new_workspace() -> Path:
    """Empty but for sessions/, as the sandbox image's /workspace."""
    workspace = _new_directory("workspace", 0o755, owned=True)
    (workspace / "sessions").mkdir(mode=0o755)
    if _as_root():
        os.chown(workspace / "sessions", SANDBOX_UID, SANDBOX_UID)
    return workspace


def _new_runtime(spec: SandboxSpec) -> _Runtime:
    root = _new_directory("runtime", 0o755, owned=False)
    for name, mode in (("home", 0o700), ("tmp", 0o1777)):
        (root / name).mkdir()
        (root / name).chmod(mode)
        if _as_root():
            os.chown(root / name, SANDBOX_UID, SANDBOX_UID)
    (root / "opt").mkdir()
    shutil.copytree(RUNTIME_FILES, root / "opt" / "quor")
    address = str(FIRST_ADDRESS + next(MemoryBackend._addresses))
    return _Runtime(runtime_id=uuid.uuid4().hex, spec=spec, root=root, address=address)


def _start_process(
    argv: list[str], *, cwd: str, env: dict[str, str], stdin: bool, as_sandbox_user=False
) -> "_HostExecution":
    """In a session of its own, so that killing its group kills its children too."""
    user = {}
    if as_sandbox_user and _as_root():
        user = {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}
    try:
        process = subprocess.Popen(  # noqa: S603  (argv, no shell: the sandbox's command)
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            umask=0o022,
            **user,
        )
    except OSError as exc:  # no such program or directory: what a shell would say
        return _HostExecution(None, failure=f"{argv[0]}: {exc.strerror}\n".encode())
    return _HostExecution(process)


class _HostExecution:
    """A process of this host, its stdout and stderr read together."""

    def __init__(self, process: subprocess.Popen | None, *, failure: bytes = b""):
        self.process, self.failure = process, failure

    def send_stdin(self, chunks: Iterable[bytes]) -> None:
        if self.process is None:
            return
        try:
            for chunk in chunks:
                self.process.stdin.write(chunk)
        except BrokenPipeError:
            pass  # the command stopped reading; its exit status says why
        finally:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()

    def output(self, read_timeout: float) -> Iterator[tuple[int, bytes]]:
        if self.process is None:
            yield STDERR, self.failure
            return
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ, STDOUT)
            selector.register(self.process.stderr, selectors.EVENT_READ, STDERR)
            while selector.get_map():
                ready = selector.select(read_timeout)
                if not ready:
                    raise TimeoutError(f"the command wrote nothing for {read_timeout:g} s")
                for key, _ in ready:
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        yield key.data, data
                    else:
                        selector.unregister(key.fileobj)

    def close(self) -> None:
        if self.process is None:
            return
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def exit_code(self) -> int:
        if self.process is None:
            return 127
        code = self.process.wait()
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says it
