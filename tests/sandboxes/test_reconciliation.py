"""Reconciliation of runtime instances with the database, with the mismatch made behind
Quor's back (the Docker API directly, as an operator or a crash would leave it)."""

import io
import subprocess
import sys
import time
import uuid

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from sandboxes.backends.docker import LABEL_DEPLOYMENT, LABEL_SANDBOX, DockerBackend
from sandboxes.models import Sandbox
from sandboxes.runtime import services
from tests.sandboxes.test_sleep_and_wake import MANIFEST, run
from tests.sandboxes.test_sleep_and_wake import session as session  # a fixture

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stray(docker_client, clean_runtimes):
    """A container and a volume labelled as this deployment's, for no sandbox row."""
    sandbox_id = str(uuid.uuid4())
    backend = DockerBackend()
    labels = {LABEL_SANDBOX: sandbox_id, LABEL_DEPLOYMENT: settings.QUOR_DEPLOYMENT}
    docker_client.volumes.create(backend.volume_name(sandbox_id), labels=labels)
    docker_client.containers.run(
        settings.QUOR_SANDBOX_IMAGE,
        entrypoint=["sleep", "600"],
        name=backend.container_name(sandbox_id),
        labels=labels,
        network_mode="none",
        detach=True,
    )
    return sandbox_id


def reconcile(*options) -> str:
    out = io.StringIO()
    call_command("sandbox_reconcile", *options, stdout=out)
    return out.getvalue()


def test_an_instance_without_a_sandbox_row_is_removed_and_a_dry_run_only_says_so(stray):
    backend = DockerBackend()
    printed = reconcile("--dry-run")
    assert f"would do: {stray}: no sandbox row; runtime and workspace removed" in printed
    assert backend.status(stray).exists  # a dry run changes nothing

    assert f"{stray}: no sandbox row" in reconcile()
    assert not backend.status(stray).exists
    assert not backend.workspace_exists(stray)
    assert "Nothing to repair" in reconcile()


def test_a_row_whose_runtime_was_removed_is_recorded_so_and_recreated_with_its_workspace(
    running_sandbox, session, docker_client
):
    before = run(running_sandbox, MANIFEST)
    docker_client.containers.get(DockerBackend().container_name(str(running_sandbox.pk))).remove(
        force=True
    )
    assert "running, but its runtime is absent: now absent" in reconcile()
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.ABSENT
    woken = services.sandbox_ensure_running(running_sandbox)  # on demand: same workspace
    assert run(woken, MANIFEST) == before


def test_a_row_whose_runtime_and_workspace_were_removed_wakes_from_its_snapshot(
    running_sandbox, session, docker_client
):
    services.sandbox_sleep(sandbox=running_sandbox, force=True)
    before = run(services.sandbox_ensure_running(running_sandbox), MANIFEST)
    backend = DockerBackend()
    docker_client.containers.get(backend.container_name(str(running_sandbox.pk))).remove(force=True)
    docker_client.volumes.get(backend.volume_name(str(running_sandbox.pk))).remove(force=True)

    assert "now sleeping" in reconcile()
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.SLEEPING
    assert run(services.sandbox_ensure_running(running_sandbox), MANIFEST) == before


def test_a_starting_worker_reconciles_before_anything_else(stray, process_env):
    """A worker of its own (the suite's shared one may not be running), started after the
    mismatch was made."""
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "quor", "worker", "-Q", "sandboxes",
            "--concurrency", "1", "--without-gossip", "--without-mingle", "--loglevel", "WARNING",
            "-n", f"reconcile-test-{uuid.uuid4().hex[:8]}@%h",
        ],
        env=process_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while DockerBackend().status(stray).exists and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not DockerBackend().status(stray).exists
    finally:
        worker.terminate()
        worker.wait(30)


def test_docker_being_unreachable_is_a_clear_error_that_changes_nothing(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(CommandError, match="Docker Engine is not reachable"):
        reconcile()
