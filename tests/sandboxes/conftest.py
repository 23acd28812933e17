"""Fixtures for tests against the real Docker Engine: sandboxes, a stand-in egress
proxy on the sandbox bridge, and clean-up of everything the test deployment made."""

import socket
import subprocess
import sys
import time

import docker
import pytest
from django.conf import settings

from sandboxes.backends.base import RuntimeMissing
from sandboxes.backends.docker import DockerBackend, sandbox_network_gateway


def wait_for_port(host: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {host}:{port}")


@pytest.fixture(scope="session")
def docker_client():
    return docker.from_env()


@pytest.fixture(scope="session")
def sandbox_proxy():
    """Plain proxy.py on the bridge gateway until the egress issue's proxy replaces it."""
    backend = DockerBackend()
    backend.ensure_network()
    host, port = sandbox_network_gateway(), settings.QUOR_EGRESS_PROXY_PORT
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "--hostname",
            host,
            "--port",
            str(port),
            "--num-acceptors",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(host, port)
        yield host, port
    finally:
        process.terminate()
        process.wait(timeout=10)


def remove_test_runtimes():
    backend = DockerBackend()
    for instance in backend.list_instances():
        backend.destroy(instance.sandbox_id, remove_workspace=True)


@pytest.fixture
def clean_runtimes():
    """Removes every container and volume of the test deployment after the test."""
    yield
    remove_test_runtimes()


@pytest.fixture
def running_sandbox(owner, sandbox_proxy, clean_runtimes):
    from sandboxes import services

    return services.sandbox_ensure(user=owner)


def container_of(docker_client, sandbox):
    try:
        return docker_client.containers.get(DockerBackend().container_name(str(sandbox.pk)))
    except docker.errors.NotFound:
        raise RuntimeMissing(str(sandbox.pk)) from None
