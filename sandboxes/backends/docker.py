"""Sandboxes as Docker containers on a dedicated bridge network.

One container per sandbox, labelled with the sandbox id and the deployment; the
workspace on a named volume; no capabilities but the four the entrypoint needs to
install its firewall and drop to the sandbox user (it drops them all before any
user code runs); read-only root filesystem; no host paths, no Docker socket.

Only Docker's side is here: starting a command (exec_create, exec_start on a hijacked
socket, output in Docker's frames, the exit code from exec_inspect) and Docker's own
archive. What a command's limits mean and how a workspace is transferred are shared by
every backend (execution.py, transfer.py).
"""

import contextlib
import functools
import ipaddress
import socket
import time
from collections.abc import Iterable, Iterator

import docker
import requests
from django.conf import settings
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Mount

from sandboxes.backends import channel, transfer
from sandboxes.backends.base import (
    BackendError,
    BackendUnavailable,
    RuntimeInstance,
    RuntimeMissing,
    RuntimeStatus,
    SandboxBackend,
    SandboxSpec,
    Terminal,
    validate_spec,
)
from sandboxes.backends.execution import (
    Execution,
    Start,
    read_frames,
    run_bounded,
    send_then_shut,
    stream_stdout,
)
from sandboxes.image import KEEP_ALIVE, SANDBOX_UID, WORKSPACE

LABEL_SANDBOX = "org.quor.sandbox-id"
LABEL_DEPLOYMENT = "org.quor.deployment"
FIREWALL_CAPABILITIES = ["NET_ADMIN", "SETUID", "SETGID", "SETPCAP"]
READY_MARKER = "/run/quor/firewall-ready"
READY_TIMEOUT_S = 20
CHANNEL_START_S = 5
USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
# Still importable from here: tests start the transfer scripts as this backend does.
RECEIVE_AND_UNPACK = transfer.RECEIVE_AND_UNPACK
SEND_ARCHIVE = transfer.SEND_ARCHIVE
_first_line = transfer.first_line


def remaps_user_ids(engine_info: dict) -> bool:
    """Whether the engine runs containers in a user namespace of their own (userns-remap,
    or rootless Docker), so that a sandbox's ids are not the host's ids."""
    options = engine_info.get("SecurityOptions") or []
    return any(option.startswith(("name=userns", "name=rootless")) for option in options)


def sandbox_network_gateway() -> str:
    """The host's address on the sandbox bridge: where the egress proxy listens."""
    return str(next(ipaddress.ip_network(settings.QUOR_SANDBOX_SUBNET).hosts()))


@functools.cache
def _api_version() -> str:
    """The Engine API version, asked once per process: the client otherwise asks at every
    construction, and a backend is made for every operation."""
    try:
        return docker.from_env().version()["ApiVersion"]
    except (DockerException, requests.exceptions.ConnectionError) as exc:
        raise _unreachable(exc) from exc


class _EngineClient(docker.APIClient):
    """Docker's API client, whose lost connections to the Engine are BackendUnavailable
    wherever they happen (docker-py lets them through as requests' own errors)."""

    def send(self, request, **kwargs):
        try:
            return super().send(request, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            raise _unreachable(exc) from exc


def _has_channel(attrs: dict) -> bool:
    """Whether the container was given an exec channel's token."""
    return any(item.startswith("QUOR_EXEC_TOKEN=") for item in attrs["Config"]["Env"] or ())


def _unreachable(exc: Exception) -> BackendUnavailable:
    return BackendUnavailable(f"Docker Engine is not reachable: {exc}")


class DockerBackend(SandboxBackend):
    name = "docker"

    def __init__(self, timeout: float = 60):
        try:
            self.client = docker.from_env(timeout=timeout, version=_api_version())
            self.client.api = _EngineClient(
                **docker.utils.kwargs_from_env(), timeout=timeout, version=_api_version()
            )
        except DockerException as exc:
            raise _unreachable(exc) from exc
        self.api = self.client.api
        self.deployment = settings.QUOR_DEPLOYMENT

    # --- names -------------------------------------------------------------------

    def container_name(self, sandbox_id: str) -> str:
        return f"quor-{self.deployment}-sandbox-{sandbox_id}"

    def volume_name(self, sandbox_id: str) -> str:
        return f"quor-{self.deployment}-workspace-{sandbox_id}"

    @property
    def network_name(self) -> str:
        return f"quor-{self.deployment}-sandboxes"

    def _labels(self, sandbox_id: str) -> dict[str, str]:
        return {LABEL_SANDBOX: sandbox_id, LABEL_DEPLOYMENT: self.deployment}

    # --- runtime -------------------------------------------------------------------

    def ping(self) -> None:
        try:
            self.api.ping()
        except DockerException as exc:
            raise _unreachable(exc) from exc

    def check_host_users(self) -> None:
        """Raises BackendError for an engine that would run the sandbox user as the
        host's uid 1000 (on most hosts, its first human user) and its root as root."""
        try:
            info = self.client.info()
        except DockerException as exc:
            raise _unreachable(exc) from exc
        if not remaps_user_ids(info):
            raise BackendError(
                "Docker Engine runs containers with the host's own user ids: a process that "
                'escaped a sandbox would act as a host account. Set "userns-remap": "default" '
                "in /etc/docker/daemon.json and restart dockerd (tools/provision does this)."
            )

    def egress_proxy_address(self) -> str:
        """The host's address on the sandboxes' bridge. Asked for every command of a
        sandbox (its proxy settings), which runs on the bridge already: no Engine call."""
        return sandbox_network_gateway()

    def egress_proxy_listen_address(self) -> str:
        """The same address, which the host has once the bridge exists (created if
        missing)."""
        self.ensure_network()
        return self.egress_proxy_address()

    def ensure_network(self):
        """The dedicated bridge: internal (no route out), no traffic between containers,
        attached to nothing but sandboxes. The host keeps the gateway address."""
        try:
            return self.client.networks.get(self.network_name)
        except NotFound:
            pass
        subnet = settings.QUOR_SANDBOX_SUBNET
        ipam = docker.types.IPAMConfig(
            pool_configs=[docker.types.IPAMPool(subnet=subnet, gateway=sandbox_network_gateway())]
        )
        try:
            return self.client.networks.create(
                self.network_name,
                driver="bridge",
                internal=True,
                ipam=ipam,
                labels={LABEL_DEPLOYMENT: self.deployment},
                options={
                    "com.docker.network.bridge.enable_icc": "false",
                    "com.docker.network.bridge.enable_ip_masquerade": "false",
                },
                check_duplicate=True,
            )
        except APIError as exc:
            if exc.status_code == 409:
                return self.client.networks.get(self.network_name)
            raise BackendError(
                f"cannot create the sandbox network {self.network_name}: {exc}"
            ) from exc

    def _container(self, sandbox_id: str):
        try:
            return self.client.containers.get(self.container_name(sandbox_id))
        except NotFound:
            raise RuntimeMissing(f"no container for sandbox {sandbox_id}") from None
        except DockerException as exc:
            raise _unreachable(exc) from exc

    def _create_kwargs(self, spec: SandboxSpec) -> dict:
        gateway = sandbox_network_gateway()
        uid = SANDBOX_UID
        environment = {
            **spec.environment,
            "QUOR_PROXY_HOST": gateway,
            "QUOR_PROXY_PORT": str(settings.QUOR_EGRESS_PROXY_PORT),
            "QUOR_CONTROL_PLANE_ADDR": gateway,
            "QUOR_EXEC_TOKEN": channel.channel_token(self.container_name(spec.sandbox_id)),
            "HOME": "/home/sandbox",
        }
        return {
            "image": spec.image,
            "command": KEEP_ALIVE,  # the entrypoint's "$@": what a sleep's stop keeps
            "name": self.container_name(spec.sandbox_id),
            "hostname": "sandbox",
            "labels": self._labels(spec.sandbox_id),
            "environment": environment,
            "detach": True,
            "network": self.network_name,
            "privileged": False,
            "cap_drop": ["ALL"],
            "cap_add": FIREWALL_CAPABILITIES,
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {
                "/tmp": "rw,exec,nosuid,nodev,size=1g,mode=1777",  # noqa: S108  (the sandbox's own)
                "/run": "rw,nosuid,nodev,noexec,size=16m,mode=755",
                "/home/sandbox": f"rw,exec,nosuid,nodev,size=512m,uid={uid},gid={uid},mode=700",
            },
            "mounts": [
                Mount(target=WORKSPACE, source=self.volume_name(spec.sandbox_id), type="volume")
            ],
            "sysctls": {
                "net.ipv6.conf.all.disable_ipv6": "1",
                "net.ipv6.conf.default.disable_ipv6": "1",
            },
            "nano_cpus": int(spec.cpus * 1e9),
            "mem_limit": spec.memory_bytes,
            "memswap_limit": spec.memory_bytes,
            "pids_limit": spec.pids_limit,
            "restart_policy": {"Name": "no"},
        }

    def image_ref(self, image: str) -> str:
        try:
            return self.client.images.get(image).id
        except ImageNotFound:
            return ""

    def ensure(self, spec: SandboxSpec) -> RuntimeStatus:
        validate_spec(spec)
        try:
            self.ensure_network()
            try:
                container = self._container(spec.sandbox_id)
            except RuntimeMissing:
                self.check_host_users()  # a restarted daemon may have lost its remapping
                self.client.volumes.create(
                    self.volume_name(spec.sandbox_id), labels=self._labels(spec.sandbox_id)
                )
                try:
                    container = self.client.containers.create(**self._create_kwargs(spec))
                except ImageNotFound:
                    raise BackendError(
                        f"the sandbox image {spec.image} is missing: run `make sandbox-image`"
                    ) from None
                except APIError as exc:
                    if exc.status_code != 409:  # 409: a concurrent create won; use it
                        raise
                    container = self._container(spec.sandbox_id)
            if container.status != "running":
                container.start()
            self._wait_until_ready(container)
            container.reload()
        except (APIError, DockerException) as exc:
            raise BackendError(f"Docker refused: {exc}") from exc
        status = self._status_of(container)
        if _has_channel(container.attrs):
            channel.remember(container.name, status.network_address)
        return status

    def _wait_until_ready(self, container) -> None:
        """Returns once the entrypoint has verified the firewall; the container exits
        without the marker if it could not. The exec channel starts only after it."""
        started = time.monotonic()
        while time.monotonic() < started + READY_TIMEOUT_S:
            container.reload()
            if container.status in ("exited", "dead"):
                logs = container.logs(tail=20).decode(errors="replace").strip()
                raise BackendError(f"the sandbox did not start: {logs or container.status}")
            over_channel = time.monotonic() < started + CHANNEL_START_S
            if container.status == "running" and self._firewall_ready(container, over_channel):
                return
            time.sleep(0.01)
        raise BackendError(f"the sandbox firewall was not ready after {READY_TIMEOUT_S} s")

    def _firewall_ready(self, container, over_channel: bool) -> bool:
        """Asked over the exec channel while it may still be starting, then (an image
        without it, a channel that failed) with `docker exec`."""
        argv = ["test", "-f", READY_MARKER]
        try:
            if over_channel and _has_channel(container.attrs):
                address = self._status_of(container).network_address
                probe = channel.run_over_channel(container.name, address, argv)
            else:
                probe = run_bounded(
                    self._runtime_starter(container.id), argv, cwd="/", env={}, timeout_s=5,
                    output_limit=4096,
                )  # fmt: skip
        except channel.ChannelUnavailable:  # not listening yet
            return False
        return probe.exit_code == 0

    def _status_of(self, container) -> RuntimeStatus:
        network = container.attrs["NetworkSettings"]["Networks"].get(self.network_name) or {}
        return RuntimeStatus(
            exists=True,
            running=container.status == "running",
            runtime_id=container.id,
            image_ref=container.attrs["Image"],
            network_address=network.get("IPAddress", ""),
            detail=container.status,
        )

    def status(self, sandbox_id: str) -> RuntimeStatus:
        try:
            return self._status_of(self._container(sandbox_id))
        except RuntimeMissing:
            return RuntimeStatus(exists=False, detail="absent")

    def stop(self, sandbox_id: str) -> None:
        try:
            self._container(sandbox_id).stop(timeout=5)
        except RuntimeMissing:
            return
        except APIError as exc:
            raise BackendError(f"Docker refused to stop the sandbox: {exc}") from exc

    def destroy(self, sandbox_id: str, *, remove_workspace: bool) -> None:
        try:
            self._container(sandbox_id).remove(force=True)
        except RuntimeMissing:
            pass
        except APIError as exc:
            if exc.status_code == 409 and "already in progress" in str(exc):
                self._wait_until_removed(sandbox_id)  # another process removes it
            elif exc.status_code != 404:
                raise BackendError(f"Docker refused to remove the sandbox: {exc}") from exc
        if remove_workspace:
            with contextlib.suppress(NotFound):
                self.client.volumes.get(self.volume_name(sandbox_id)).remove(force=True)

    def _wait_until_removed(self, sandbox_id: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                self._container(sandbox_id)
            except RuntimeMissing:
                return
            time.sleep(0.05)
        raise BackendError(
            f"the sandbox's container was still being removed after {READY_TIMEOUT_S} s"
        )

    def list_instances(self) -> list[RuntimeInstance]:
        """One listing, without inspecting each container: one removed meanwhile (a pool
        refill, a destroy) is simply not listed."""
        try:
            containers = self.api.containers(
                all=True, filters={"label": f"{LABEL_DEPLOYMENT}={self.deployment}"}
            )
        except DockerException as exc:
            raise _unreachable(exc) from exc
        return [
            RuntimeInstance(
                sandbox_id=(c.get("Labels") or {}).get(LABEL_SANDBOX, ""),
                runtime_id=c["Id"],
                running=c.get("State") == "running",
            )
            for c in containers
        ]

    def list_workspaces(self) -> list[str]:
        try:
            volumes = self.client.volumes.list(
                filters={"label": f"{LABEL_DEPLOYMENT}={self.deployment}"}
            )
        except DockerException as exc:
            raise _unreachable(exc) from exc
        return [v.attrs.get("Labels", {}).get(LABEL_SANDBOX, "") for v in volumes]

    def workspace_exists(self, sandbox_id: str) -> bool:
        try:
            self.client.volumes.get(self.volume_name(sandbox_id))
        except NotFound:
            return False
        except DockerException as exc:
            raise _unreachable(exc) from exc
        return True

    # --- exec ------------------------------------------------------------------------

    def exec(self, sandbox_id, argv, *, cwd, env, timeout_s, output_limit, stdin=None):
        return run_bounded(
            self._starter(sandbox_id),
            argv,
            cwd=cwd,
            env=env,
            timeout_s=timeout_s,
            output_limit=output_limit,
            stdin=stdin,
        )

    def _starter(self, sandbox_id: str) -> Start:
        """Starts commands in the sandbox (execution.Start): over its exec channel, or
        with `docker exec` when it has none."""
        name = self.container_name(sandbox_id)
        return channel.starter(
            name, lambda: self._channel_address(name), self._runtime_starter(name)
        )

    def _channel_address(self, name: str) -> str | None:
        """None for a container that is not running or has no channel."""
        try:
            attrs = self.api.inspect_container(name)
        except NotFound:
            return None
        except DockerException as exc:
            raise _unreachable(exc) from exc
        network = attrs["NetworkSettings"]["Networks"].get(self.network_name) or {}
        address = network.get("IPAddress", "")
        return address if attrs["State"]["Running"] and _has_channel(attrs) else None

    def _runtime_starter(self, container_id: str) -> Start:
        """Starts commands with `docker exec`."""

        def start(argv, *, cwd, env, stdin) -> Execution:
            exec_id, hijacked = self._start_exec(container_id, argv, cwd, env, stdin)
            return _DockerExecution(self, exec_id, hijacked)

        return start

    def _start_exec(self, container_id, argv, cwd, env, with_stdin):
        try:
            exec_id = self.api.exec_create(
                container_id,
                argv,
                stdout=True,
                stderr=True,
                stdin=with_stdin,
                user=USER,
                workdir=cwd,
                environment=env,
            )["Id"]
            response_socket = self.api.exec_start(exec_id, socket=True)
        except NotFound:
            raise RuntimeMissing(f"container {container_id} is gone") from None
        except APIError as exc:
            if exc.status_code == 409:  # exists but is not running
                raise RuntimeMissing(f"container {container_id} is not running") from None
            raise BackendError(f"Docker refused the command: {exc}") from exc
        return exec_id, response_socket

    def _exit_code(self, exec_id: str) -> int:
        for _ in range(100):
            info = self.api.exec_inspect(exec_id)
            if not info["Running"] and info["ExitCode"] is not None:
                return info["ExitCode"]
            time.sleep(0.01)
        raise BackendError("the command's exit code never became available")

    def exec_stream(self, sandbox_id, argv, *, cwd) -> Iterator[bytes]:
        yield from stream_stdout(self._starter(sandbox_id), argv, cwd=cwd)

    def open_terminal(self, sandbox_id, argv, *, cwd, env, cols, rows) -> Terminal:
        """With `docker exec` and a TTY: the exec channel has no PTY, and Docker's gives
        resizes and raw output (no frames) for free."""
        name = self.container_name(sandbox_id)
        try:
            exec_id = self.api.exec_create(
                name, argv, stdin=True, stdout=True, stderr=True, tty=True, user=USER,
                workdir=cwd, environment=env,
            )["Id"]  # fmt: skip
            hijacked = self.api.exec_start(exec_id, socket=True, tty=True)
        except NotFound:
            raise RuntimeMissing(f"no container for sandbox {sandbox_id}") from None
        except APIError as exc:
            if exc.status_code == 409:
                raise RuntimeMissing(f"the sandbox {sandbox_id} is not running") from None
            raise BackendError(f"Docker refused the terminal: {exc}") from exc
        terminal = _DockerTerminal(self, exec_id, hijacked)
        terminal.sock.settimeout(None)  # a terminal is quiet for as long as its user likes
        terminal.resize(cols, rows)
        return terminal

    # --- workspace streams (snapshots) -------------------------------------------------

    def export_workspace(self, sandbox_id: str, path: str = ".") -> Iterator[bytes]:
        # "/." : the directory's contents, with names relative to the workspace.
        stream, _ = self._container(sandbox_id).get_archive(
            f"{WORKSPACE}/{path}", chunk_size=1 << 20
        )
        return stream

    def export_workspace_as_sandbox_user(
        self, sandbox_id: str, *, excluded: str
    ) -> Iterator[bytes]:
        """Made by `tar` in the sandbox and read over TCP (transfer.py): Docker's archive
        API reads at about 280 MB/s, as long as `tar | zstd` takes on the host
        (bench/snapshot.py)."""
        container = self._container(sandbox_id)
        address = self._status_of(container).network_address
        yield from transfer.send_workspace(self._starter(sandbox_id), address, excluded=excluded)

    def import_workspace(self, sandbox_id: str, tar_stream: Iterable[bytes]) -> None:
        """Unpacked by tar run as the sandbox user in the sandbox (modes kept, every file
        the sandbox user's): nothing in the archive is written as root. The bytes go over
        a TCP connection from the host (transfer.py), not through the exec's stdin."""
        container = self._container(sandbox_id)
        address = self._status_of(container).network_address
        transfer.receive_workspace(self._starter(sandbox_id), address, tar_stream)


class _Hijacked:
    """The socket exec_start hijacked, and docker-py's file object around it, kept as long
    as the socket is used: that object holds the HTTP response the socket belongs to, and
    once both are garbage, the connection closes the socket under whoever still reads it
    (EBADF, at whatever moment the collector runs)."""

    def __init__(self, hijacked):
        self._hijacked = hijacked
        self.sock: socket.socket = hijacked._sock

    def close(self) -> None:
        self.sock.close()
        self._hijacked.close()


class _DockerExecution(_Hijacked):
    """A command started by exec_start: stdin and output on the socket Docker hijacked
    (output in Docker's frames), the exit code from exec_inspect."""

    def __init__(self, backend: DockerBackend, exec_id: str, hijacked):
        super().__init__(hijacked)
        self.backend, self.exec_id = backend, exec_id

    def send_stdin(self, chunks: Iterable[bytes]) -> None:
        send_then_shut(self.sock, chunks)

    def output(self, read_timeout: float) -> Iterator[tuple[int, bytes]]:
        self.sock.settimeout(read_timeout)
        return read_frames(self.sock)

    def exit_code(self) -> int:
        return self.backend._exit_code(self.exec_id)


class _DockerTerminal(_Hijacked, Terminal):
    """A `docker exec` with a TTY: the PTY's bytes both ways on the hijacked socket."""

    def __init__(self, backend: DockerBackend, exec_id: str, hijacked):
        super().__init__(hijacked)
        self.backend, self.exec_id = backend, exec_id

    def read(self) -> bytes:
        try:
            return self.sock.recv(1 << 16)
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # ended: the next read says so
            self.sock.sendall(data)

    def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(DockerException, BackendError):  # ended meanwhile
            self.backend.api.exec_resize(self.exec_id, height=rows, width=cols)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        super().close()

    def exit_code(self) -> int | None:
        """Asked for a moment: Docker sees the command end shortly after its socket."""
        deadline = time.monotonic() + 2
        while True:
            try:
                info = self.backend.api.exec_inspect(self.exec_id)
            except (DockerException, BackendError):
                return None
            if not info["Running"] or time.monotonic() > deadline:
                return None if info["Running"] else info["ExitCode"]
            time.sleep(0.05)
