"""The backends the contract suite runs against, and how a test drives each one's engine
from outside (what an operator, a host restart or an outage would do)."""

import os
import uuid

import pytest
from django.conf import settings

from sandboxes.backends.base import SandboxSpec
from sandboxes.backends.memory import MemoryBackend

MISSING_DOCKER_SOCKET = "unix:///nonexistent/quor-test/docker.sock"


class MemoryEngine:
    name = "memory"
    # Commands run as uid 1000 only when the tests run as root (memory.py).
    runs_as_sandbox_user = os.geteuid() == 0

    def backend(self):
        return MemoryBackend()

    def unreachable_backend(self, monkeypatch):
        """A backend made while its engine was there, which then went away."""
        backend = MemoryBackend()
        monkeypatch.setattr(MemoryBackend, "unreachable", True)
        return backend

    def lose_runtime(self, sandbox_id):
        MemoryBackend.lose_runtime(sandbox_id)

    def close(self):
        MemoryBackend.reset()


class DockerEngine:
    name = "docker"
    runs_as_sandbox_user = True

    def backend(self):
        from sandboxes.backends.docker import DockerBackend

        return DockerBackend()

    def unreachable_backend(self, monkeypatch):
        """A backend pointed at a Docker socket that does not exist."""
        from sandboxes.backends.docker import DockerBackend

        monkeypatch.setenv("DOCKER_HOST", MISSING_DOCKER_SOCKET)
        return DockerBackend()

    def lose_runtime(self, sandbox_id):
        import docker

        backend = self.backend()
        docker.from_env().containers.get(backend.container_name(sandbox_id)).remove(force=True)

    def close(self):
        pass


ENGINES = {"memory": MemoryEngine, "docker": DockerEngine}


@pytest.fixture(scope="module", params=["memory", pytest.param("docker", marks=pytest.mark.docker)])
def engine(request):
    engine = ENGINES[request.param]()
    yield engine
    engine.close()


def new_spec(**fields) -> SandboxSpec:
    """A small sandbox with a new id (a UUID, as Quor's are), on the deployment's image."""
    return SandboxSpec(
        sandbox_id=str(uuid.uuid4()),
        image=settings.QUOR_SANDBOX_IMAGE,
        cpus=1.0,
        memory_bytes=512 * 1024 * 1024,
        pids_limit=256,
        **fields,
    )


@pytest.fixture(scope="module")
def shared(engine):
    """One running sandbox for every test that leaves it running: (backend, spec)."""
    backend, spec = engine.backend(), new_spec()
    backend.ensure(spec)
    yield backend, spec
    backend.destroy(spec.sandbox_id, remove_workspace=True)


@pytest.fixture
def fresh(engine):
    """Starts new sandboxes of the test's own, removed (with their workspaces) after it:
    `fresh()` gives (backend, spec)."""
    backend, made = engine.backend(), []

    def start():
        spec = new_spec()
        made.append(spec.sandbox_id)
        backend.ensure(spec)
        return backend, spec

    yield start
    for sandbox_id in made:
        backend.destroy(sandbox_id, remove_workspace=True)
