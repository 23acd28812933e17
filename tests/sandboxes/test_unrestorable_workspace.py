"""A workspace that cannot be restored is never silently replaced by an empty one: the
sandbox says why, on the pages, in the API and to operators, until someone explicitly
starts it empty (recorded). A file store that is merely the wrong one, or out of reach,
leaves it asleep with its snapshots good."""

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from quor.filestore import file_store_check
from sandboxes.backends.docker import DockerBackend
from sandboxes.models import Sandbox, Snapshot, WorkspaceReset
from sandboxes.runtime import services, tasks
from sandboxes.runtime.pool import runtime_spec
from tests import factories
from tests.sandboxes.test_sleep_and_wake import run, sleep

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def session(owner, running_sandbox):
    session = factories.make_session(owner, sandbox=running_sandbox)
    run(
        running_sandbox,
        'echo "my work" > "$1/notes.txt"',
        services.session_workspace_ensure(session=session),
    )
    return session


def notes(sandbox, session) -> str:
    return run(sandbox, 'cat "$1/notes.txt"', services.session_workspace(session))


def page_of(user, session) -> str:
    client = Client()
    client.force_login(user)
    return client.get(f"/sessions/{session.pk}/").content.decode()


def test_a_wake_from_a_store_the_workers_do_not_use_stays_asleep_with_its_snapshot_good(
    owner, running_sandbox, session, another_file_store
):
    snapshot = sleep(running_sandbox)
    with another_file_store(), pytest.raises(services.SandboxUnavailable) as refused:
        services.sandbox_ensure_running(running_sandbox)
    assert "no Quor marker" in refused.value.message
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.SLEEPING
    assert "no Quor marker" in running_sandbox.failure_reason
    snapshot.refresh_from_db()
    assert snapshot.status == Snapshot.Status.GOOD
    assert not DockerBackend().status(str(running_sandbox.pk)).exists
    assert "could not wake up" in page_of(owner, session)

    woken = services.sandbox_ensure_running(running_sandbox)  # the right store again
    assert notes(woken, session) == "my work\n"


def test_a_wake_while_the_s3_store_is_out_of_reach_stays_asleep_with_its_snapshot_good(
    owner, running_sandbox, session, s3_file_store, settings
):
    snapshot = sleep(running_sandbox)
    reachable = settings.STORAGES["quor_files"]
    settings.STORAGES = {
        **settings.STORAGES,
        "quor_files": {
            **reachable,
            "OPTIONS": {**reachable["OPTIONS"], "endpoint_url": "http://127.0.0.1:9"},
        },
    }
    with pytest.raises(services.SandboxUnavailable, match="cannot be reached"):
        services.sandbox_ensure_running(running_sandbox)
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.SLEEPING
    snapshot.refresh_from_db()
    assert snapshot.status == Snapshot.Status.GOOD

    settings.STORAGES = {**settings.STORAGES, "quor_files": reachable}
    assert notes(services.sandbox_ensure_running(running_sandbox), session) == "my work\n"


def test_a_snapshot_taken_from_a_checkout_with_another_store_is_refused_and_nothing_changes(
    owner, running_sandbox, session, another_file_store
):
    file_store_check()  # as every worker does when it starts: the store is the database's
    with another_file_store() as other, pytest.raises(CommandError, match="misconfigured"):
        call_command("sandbox_snapshot", owner.email)
    assert other.keys() == set()
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.RUNNING
    assert not Snapshot.objects.exists()
    assert notes(running_sandbox, session) == "my work\n"


def test_with_every_snapshot_missing_nothing_replaces_the_workspace_until_the_user_says_so(
    owner, running_sandbox, session, local_file_store, client_for
):
    snapshot = sleep(running_sandbox)
    local_file_store.delete_raw(snapshot.blob.key)
    with pytest.raises(services.WorkspaceUnrestorable):
        services.sandbox_ensure_running(running_sandbox)
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.UNRESTORABLE
    assert "missing" in running_sandbox.failure_reason

    # No request, task or reconciliation starts it empty.
    with pytest.raises(services.WorkspaceUnrestorable):
        services.sandbox_ensure_running(running_sandbox)
    tasks.ensure_sandbox(str(running_sandbox.pk))
    tasks.sleep_sandbox(str(running_sandbox.pk))
    services.sandboxes_reconcile()
    api = client_for(owner)
    requested = api.post("/api/v1/sandbox/", {}, format="json")
    assert requested.status_code == 409
    assert requested.json()["error"]["code"] == "sandboxes.workspace_unrestorable"
    provider = factories.make_provider(owner.membership.organization)
    model = f"{provider.pk}:claude-test"
    created = api.post("/api/v1/sessions/", {"prompt": "go on", "model": model}, format="json")
    assert created.status_code == 409
    assert created.json()["error"]["code"] == "sandboxes.workspace_unrestorable"
    follow_up = api.post(
        f"/api/v1/sessions/{session.pk}/messages/", {"text": "go on"}, format="json"
    )
    assert follow_up.status_code == 409
    assert follow_up.json()["error"]["code"] == "sandboxes.workspace_unrestorable"
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.UNRESTORABLE
    assert not DockerBackend().status(str(running_sandbox.pk)).exists
    assert not DockerBackend().workspace_exists(str(running_sandbox.pk))

    # The user sees why, on the page and in the API.
    page = page_of(owner, session)
    assert "Your workspace could not be restored" in page
    assert "missing" in page
    state = api.get("/api/v1/sandbox/").json()
    assert state["state"] == "unrestorable" and "missing" in state["failure_reason"]
    # And operators, in sandbox_status.
    status = io.StringIO()
    call_command("sandbox_status", owner.email, stdout=status)
    assert "unrestorable" in status.getvalue() and "missing" in status.getvalue()

    # Without the confirmation nothing happens.
    unconfirmed = api.post("/api/v1/sandbox/start-empty/", {"confirm": False}, format="json")
    assert unconfirmed.status_code == 400
    assert unconfirmed.json()["error"]["code"] == "sandboxes.confirmation_required"
    browser = Client()
    browser.force_login(owner)
    browser.post("/sandbox/start-empty", {"next": f"/sessions/{session.pk}/"})
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.UNRESTORABLE
    assert not WorkspaceReset.objects.exists()

    # Confirmed: recorded, and the next start is empty.
    browser.post("/sandbox/start-empty", {"confirm": "yes", "next": f"/sessions/{session.pk}/"})
    reset = WorkspaceReset.objects.get()
    assert (reset.action, reset.actor, reset.via) == ("started_empty", owner, "page")
    assert "missing" in reset.replaced
    woken = services.sandbox_ensure_running(running_sandbox)
    assert woken.state == Sandbox.State.RUNNING
    assert str(session.pk) not in run(woken, "ls -A /workspace/sessions")
    assert "this sandbox's workspace was replaced" in page_of(owner, session)


def test_a_workspace_removed_behind_quors_back_without_a_snapshot_is_reported_not_recreated(
    owner, running_sandbox, session
):
    DockerBackend().destroy(str(running_sandbox.pk), remove_workspace=True)
    assert services.sandboxes_reconcile().actions
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.UNRESTORABLE
    assert "no snapshot" in running_sandbox.failure_reason
    with pytest.raises(services.WorkspaceUnrestorable):
        services.sandbox_ensure_running(running_sandbox)
    assert not DockerBackend().workspace_exists(str(running_sandbox.pk))


def test_a_runtime_found_gone_at_the_next_request_is_reported_not_recreated_empty(
    owner, running_sandbox, session
):
    DockerBackend().destroy(str(running_sandbox.pk), remove_workspace=True)
    with pytest.raises(services.WorkspaceUnrestorable):
        services.sandbox_ensure_running(running_sandbox)
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.UNRESTORABLE
    assert not DockerBackend().workspace_exists(str(running_sandbox.pk))


def test_an_operator_starts_an_unrestorable_sandbox_empty_only_when_told_yes(owner):
    sandbox = factories.make_sandbox(
        owner, state=Sandbox.State.UNRESTORABLE, has_workspace=True,
        failure_reason="Could not restore the workspace: its snapshot is damaged.",
    )  # fmt: skip
    with pytest.raises(CommandError, match="--yes"):
        call_command("sandbox_start_empty", owner.email)
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.UNRESTORABLE

    call_command("sandbox_start_empty", owner.email, "--yes")
    sandbox.refresh_from_db()
    assert (sandbox.state, sandbox.has_workspace) == (Sandbox.State.ABSENT, False)
    reset = WorkspaceReset.objects.get()
    assert (reset.actor, reset.via) == (None, "operator command")
    assert "damaged" in reset.replaced


def test_a_workspace_that_is_not_lost_is_never_started_empty(owner, client_for):
    sandbox = factories.make_sandbox(owner, state=Sandbox.State.SLEEPING, has_workspace=True)
    answer = client_for(owner).post(
        "/api/v1/sandbox/start-empty/", {"confirm": True}, format="json"
    )
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "sandboxes.workspace_not_lost"
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.SLEEPING
    assert not WorkspaceReset.objects.exists()


def test_a_workspace_lost_while_in_use_comes_back_as_its_snapshot_and_that_is_told(
    owner, running_sandbox, session
):
    sleep(running_sandbox)
    woken = services.sandbox_ensure_running(running_sandbox)
    assert woken.failure_reason == ""  # an ordinary wake says nothing
    run(woken, 'echo "newer work" > "$1/notes.txt"', services.session_workspace(session))

    DockerBackend().destroy(str(running_sandbox.pk), remove_workspace=True)
    services.sandboxes_reconcile()
    assert "lost while in use" in page_of(owner, session)  # before the wake too
    woken = services.sandbox_ensure_running(running_sandbox)
    assert notes(woken, session) == "my work\n"  # the snapshot: the best there is
    assert "lost while in use" in woken.failure_reason
    reset = WorkspaceReset.objects.get()
    assert (reset.action, reset.via) == ("restored_older", "automatic")
    assert "while in use" in reset.replaced  # what it replaced: the reason until then
    assert "lost while in use" in page_of(owner, session)

    sleep(woken)  # the next sleep holds the whole workspace again
    assert services.sandbox_ensure_running(woken).failure_reason == ""


def test_a_start_that_died_before_recording_its_runtime_still_counts_as_a_workspace(
    owner, running_sandbox, session
):
    Sandbox.objects.filter(pk=running_sandbox.pk).update(
        state=Sandbox.State.PROVISIONING, has_workspace=False, newer_than_snapshot=False
    )
    services.sandboxes_reconcile()
    running_sandbox.refresh_from_db()
    assert (running_sandbox.state, running_sandbox.has_workspace) == ("running", True)

    DockerBackend().destroy(str(running_sandbox.pk), remove_workspace=True)
    with pytest.raises(services.WorkspaceUnrestorable):
        services.sandbox_ensure_running(running_sandbox)


def test_keeping_the_workspace_of_a_dead_wake_keeps_the_snapshot_not_a_partial_unpack(
    owner, running_sandbox, session
):
    sleep(running_sandbox)
    backend = DockerBackend()  # what a wake killed before its unpack leaves: an empty one
    backend.ensure(runtime_spec(running_sandbox.backend_sandbox_id))
    Sandbox.objects.filter(pk=running_sandbox.pk).update(state=Sandbox.State.RESTORING)
    services.sandbox_destroy(sandbox=running_sandbox, remove_workspace=False)
    running_sandbox.refresh_from_db()
    assert running_sandbox.state == Sandbox.State.SLEEPING
    assert not DockerBackend().workspace_exists(str(running_sandbox.pk))
    assert notes(services.sandbox_ensure_running(running_sandbox), session) == "my work\n"


def test_reconciliation_marks_a_kept_volume_of_a_row_from_before_the_flags(
    owner, running_sandbox, session
):
    """An absent row whose runtime went but whose volume stayed, written before
    `has_workspace` existed: once its volume is gone too, it must not start empty."""
    DockerBackend().destroy(str(running_sandbox.pk), remove_workspace=False)
    Sandbox.objects.filter(pk=running_sandbox.pk).update(
        state=Sandbox.State.ABSENT, has_workspace=False, newer_than_snapshot=False
    )
    services.sandboxes_reconcile()
    running_sandbox.refresh_from_db()
    assert (running_sandbox.has_workspace, running_sandbox.newer_than_snapshot) == (True, True)

    DockerBackend().destroy(str(running_sandbox.pk), remove_workspace=True)
    with pytest.raises(services.WorkspaceUnrestorable):
        services.sandbox_ensure_running(running_sandbox)
