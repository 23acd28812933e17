"""The interface every sandbox backend implements."""


class BackendUnavailable(Exception):
    """The runtime (Docker Engine, the Kubernetes API) cannot be reached."""


class SandboxBackend:
    name = ""

    def ping(self) -> None:
        """Raises BackendUnavailable when the runtime cannot be reached."""
        raise NotImplementedError
