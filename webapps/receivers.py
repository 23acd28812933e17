"""Web apps acting on what happens to their sandbox's runtime (sandboxes/signals.py)."""

import contextlib

from sandboxes.backends.base import BackendError
from sandboxes.models import Sandbox
from sandboxes.signals import runtime_ready
from webapps.services import webapps_restart


def restart_web_apps(sender, *, sandbox: Sandbox, **kwargs) -> None:
    """Their servers were stopped with the sandbox's processes (or never ran in a new
    runtime): started again. A server that fails is logged by webapps_restart and answers
    502 until the agent starts it again; it never keeps the sandbox from running."""
    with contextlib.suppress(BackendError):
        webapps_restart(sandbox)


def connect() -> None:
    runtime_ready.connect(restart_web_apps, dispatch_uid="webapps-restart")
