"""Helpers for tests against the real Docker Engine."""

import contextlib
import re
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import docker

from sandboxes.backends.base import BackendUnavailable, RuntimeMissing
from sandboxes.backends.docker import DockerBackend


def wait_for_http(url: str, timeout: float = 60) -> None:
    """Returns once `url` answers 2xx: a web tier that accepts connections (its socket is
    bound first) may still be loading Django."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310 (errors raise)
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def wait_for_port(host: str, port: int, timeout: float = 30, log: Path | None = None) -> None:
    """Returns once something accepts connections there; else fails with the log of the
    process that should have listened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    output = log.read_text() if log else ""
    raise RuntimeError(f"nothing listens on {host}:{port}\n{output}")


def wait_for_egress_proxy(process, listen: str, since: float, log: Path, timeout: float = 60):
    """Returns once the egress proxy `process`, listening at `listen` (host:port), said it is
    ready after `since` (a time.time(); egress/readiness.py). Not a connection to its port:
    its host is the host's address on the sandboxes' bridge, which exists only once the
    proxy has made the bridge, and until then the machine's default route takes the
    connection elsewhere (here, to a gateway that accepts connections to any address)."""
    from egress import readiness

    deadline = time.monotonic() + timeout
    while True:
        report = readiness.readiness()
        if report and report["listen"] == listen and report["at"] >= since:
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the egress proxy at {listen} is not ready\n{log.read_text()}")
        time.sleep(0.1)


def remove_test_runtimes() -> None:
    backend = DockerBackend()
    for instance in backend.list_instances():
        backend.destroy(instance.sandbox_id, remove_workspace=True)
    for sandbox_id in backend.list_workspaces():  # kept by a destroy without its workspace
        backend.destroy(sandbox_id, remove_workspace=True)


def remove_this_workers_docker_objects() -> None:
    """Every container, volume and network of this worker's deployment (its name is the
    worker's own: tests/environment.py), and nothing of anyone else's. Without a Docker
    Engine there is nothing to remove."""
    try:
        backend = DockerBackend()
    except BackendUnavailable:
        return
    remove_test_runtimes()
    for network in backend.client.networks.list(names=[backend.network_name]):
        if network.name == backend.network_name:  # names= matches a part of the name
            network.remove()


def container_of(docker_client, sandbox):
    try:
        return docker_client.containers.get(
            DockerBackend().container_name(sandbox.backend_sandbox_id)
        )
    except docker.errors.NotFound:
        raise RuntimeMissing(sandbox.backend_sandbox_id) from None


@contextlib.contextmanager
def canary_server(host: str):
    """A server that accepts and closes every connection, on `host` (all addresses with
    0.0.0.0): the host reaches it, so a sandbox that cannot was stopped on its way. Yields
    its port."""
    server = socket.create_server((host, 0))
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


def host_ipv4_addresses() -> list[str]:
    """The host's IPv4 addresses other than 127.0.0.1."""
    output = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(set(re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", output)) - {"127.0.0.1"})
