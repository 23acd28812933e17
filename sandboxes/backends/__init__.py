"""Sandbox backends. Nothing outside this package imports the Docker or Kubernetes SDK."""

from django.conf import settings
from django.utils.module_loading import import_string

from sandboxes.backends.base import BackendError, SandboxBackend

BACKENDS = {
    "docker": "sandboxes.backends.docker.DockerBackend",
    "kubernetes": "sandboxes.backends.kubernetes.KubernetesBackend",
    "memory": "sandboxes.backends.memory.MemoryBackend",  # tests only (quor.E006)
}


def get_backend(name: str | None = None) -> SandboxBackend:
    """Every process asks here, so the memory backend (which isolates nothing) is refused
    in production even where no system check runs (daphne, Celery) and for a sandbox row
    that names it."""
    name = name or settings.QUOR_SANDBOX_BACKEND
    if name == "memory" and not settings.DEBUG:
        raise BackendError("The memory backend is for tests only (QUOR_DEBUG is off).")
    return import_string(BACKENDS[name])()
