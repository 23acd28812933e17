"""Sandboxes as Docker containers on a dedicated bridge network."""

import docker
from docker.errors import DockerException

from sandboxes.backends.base import BackendUnavailable, SandboxBackend


class DockerBackend(SandboxBackend):
    name = "docker"

    def __init__(self, timeout: float = 30):
        self.timeout = timeout

    def _client(self, timeout: float | None = None):
        try:
            return docker.from_env(timeout=timeout or self.timeout)
        except DockerException as exc:
            raise BackendUnavailable(f"Docker Engine is not reachable: {exc}") from exc

    def ping(self) -> None:
        try:
            self._client(timeout=3).ping()
        except DockerException as exc:
            raise BackendUnavailable(f"Docker Engine is not reachable: {exc}") from exc
