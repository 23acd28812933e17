"""A process doing a sleep or a wake is killed with SIGKILL at each point of the work
(mid-stream, between every write to PostgreSQL and its side effect). Afterwards the
sandbox is running with its data or sleeping with a good snapshot, never neither;
reconciliation puts the half-done state back, and the next attempt succeeds.

The work runs in a child process (the same code a Celery worker runs, `DRIVER` below);
the test wraps one function in that child so that the child kills itself right there."""

import subprocess
import sys

import pytest

from sandboxes.backends.docker import DockerBackend
from sandboxes.models import Sandbox, Snapshot
from sandboxes.runtime import services
from tests.sandboxes.test_sleep_and_wake import MANIFEST, run
from tests.sandboxes.test_sleep_and_wake import session as session  # a fixture

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

DRIVER = r"""
import os, signal, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quor.settings")
django.setup()
from sandboxes.runtime import services
from sandboxes.backends.docker import DockerBackend
from sandboxes.models import Sandbox

action, point, sandbox_id = sys.argv[1:4]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def after(module, name, when=lambda *args, **kwargs: True):
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        if when(*args, **kwargs):
            die()
        return result

    setattr(module, name, wrapped)


def mid_stream(name, stream_argument=None):
    original = getattr(DockerBackend, name)

    def cut(chunks):
        for number, chunk in enumerate(chunks):
            if number == 2:
                die()
            yield chunk

    if stream_argument is None:  # export: the stream is what it returns
        setattr(DockerBackend, name, lambda self, *a, **kw: cut(original(self, *a, **kw)))
    else:  # import: the stream is what it is given
        setattr(DockerBackend, name, lambda self, sid, chunks: original(self, sid, cut(chunks)))


def state_is(state):
    return lambda sandbox, new_state, **fields: new_state == state


if point == "export-midway":
    mid_stream("export_workspace_as_sandbox_user")
elif point == "import-midway":
    mid_stream("import_workspace", stream_argument=True)
elif point == "after-snapshot-recorded":
    after(services, "snapshot_take")
elif point.startswith("after-state-"):
    after(services, "_set_state", state_is(point.removeprefix("after-state-")))
elif point == "after-runtime-removed":
    after(DockerBackend, "destroy")
elif point == "after-restore":
    after(services, "snapshot_restore")
elif point == "after-skills-and-web-apps":  # the last receiver of runtime_ready
    from sandboxes.signals import runtime_ready

    runtime_ready.connect(lambda sender, **kwargs: die(), weak=False)

sandbox = Sandbox.objects.get(pk=sandbox_id)
if action == "sleep":
    services.sandbox_sleep(sandbox=sandbox, force=True)
else:
    services.sandbox_ensure_running(sandbox)
print("finished without being killed")
"""


def killed_during(process_env, action, point, sandbox):
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, action, point, str(sandbox.pk)],
        env=process_env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr[-2000:])


def assert_running_with(sandbox, manifest):
    assert sandbox.state == Sandbox.State.RUNNING
    assert run(sandbox, MANIFEST) == manifest


def assert_sleeping_with_a_good_snapshot(sandbox):
    assert sandbox.state == Sandbox.State.SLEEPING
    snapshot = Snapshot.objects.filter(sandbox=sandbox, status=Snapshot.Status.GOOD).first()
    assert snapshot is not None


@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("export-midway", "running"),
        ("after-state-snapshotting", "running"),
        ("after-snapshot-recorded", "running"),
        ("after-state-sleeping", "sleeping"),
        ("after-runtime-removed", "sleeping"),
    ],
)
def test_a_sleep_killed_anywhere_leaves_a_running_or_a_sleeping_sandbox_and_can_be_done_again(
    process_env, running_sandbox, session, point, outcome
):
    before = run(running_sandbox, MANIFEST)
    killed_during(process_env, "sleep", point, running_sandbox)
    running_sandbox.refresh_from_db()
    left_in = running_sandbox.state

    found = services.sandboxes_reconcile()  # what a worker does when it starts
    running_sandbox.refresh_from_db()
    if outcome == "running":
        assert left_in == Sandbox.State.SNAPSHOTTING
        assert (
            f"{running_sandbox.pk}: snapshotting with its runtime running: running" in found.actions
        )
        assert_running_with(running_sandbox, before)
    else:
        assert_sleeping_with_a_good_snapshot(running_sandbox)
        assert not DockerBackend().status(str(running_sandbox.pk)).exists

    if outcome == "running":  # the next attempt succeeds
        assert services.sandbox_sleep(sandbox=running_sandbox, force=True) is not None
    woken = services.sandbox_ensure_running(running_sandbox)
    assert_running_with(woken, before)


@pytest.mark.parametrize(
    "point",
    [
        "after-state-restoring",
        "import-midway",
        "after-restore",
        "after-skills-and-web-apps",
        "after-runtime-removed",
    ],
)
def test_a_wake_killed_anywhere_leaves_a_sleeping_sandbox_that_wakes_next_time(
    process_env, running_sandbox, session, point
):
    before = run(running_sandbox, MANIFEST)
    services.sandbox_sleep(sandbox=running_sandbox, force=True)
    killed_during(process_env, "wake", point, running_sandbox)

    found = services.sandboxes_reconcile()
    running_sandbox.refresh_from_db()
    assert_sleeping_with_a_good_snapshot(running_sandbox)
    assert any("wake died half-way" in action for action in found.actions)
    assert not DockerBackend().status(str(running_sandbox.pk)).exists

    woken = services.sandbox_ensure_running(running_sandbox)
    assert_running_with(woken, before)
