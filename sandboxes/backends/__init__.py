"""Sandbox backends. Nothing outside this package imports the Docker or Kubernetes SDK."""

from django.conf import settings
from django.utils.module_loading import import_string

from sandboxes.backends.base import SandboxBackend

BACKENDS = {
    "docker": "sandboxes.backends.docker.DockerBackend",
    "memory": "sandboxes.backends.memory.MemoryBackend",  # tests only (quor.E006)
}


def get_backend(name: str | None = None) -> SandboxBackend:
    name = name or settings.QUOR_SANDBOX_BACKEND
    return import_string(BACKENDS[name])()
