"""Per-organization bounds: sessions with the agent at work, and sandboxes with a
runtime. Beyond them a new session, a follow-up or a start is refused (429) before
anything is written."""

import threading
import time

import pytest
from django.db import connection

from sandboxes.backends.memory import MemoryBackend
from sandboxes.models import AgentEvent, Sandbox, Session
from sandboxes.runtime import services
from sandboxes.sessions import services as sessions
from tests import factories

SESSIONS = "/api/v1/sessions/"


@pytest.fixture
def open_sessions_limit(settings):
    settings.QUOR_ORGANIZATION_MAX_OPEN_SESSIONS = 2
    settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES = 0


@pytest.fixture
def memory_sandboxes(settings):
    """The memory backend (tests only) starts runtimes as directories of this host."""
    settings.DEBUG = True
    settings.QUOR_SANDBOX_BACKEND = "memory"
    yield
    MemoryBackend.reset()


# --- sessions ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_new_session_beyond_the_organizations_limit_is_refused_and_writes_nothing(
    open_sessions_limit, client_for, owner, colleague, model_id, queued
):
    factories.make_session(owner, status=Session.Status.RUNNING)
    factories.make_session(owner, status=Session.Status.PENDING)
    response = client_for(colleague).post(
        SESSIONS, {"prompt": "Write hello.py", "model": model_id}, format="json"
    )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "sessions.organization_limit_reached"
    assert Session.objects.filter(owner=colleague).count() == 0
    assert not Sandbox.objects.filter(user=colleague).exists()
    assert queued == []


@pytest.mark.django_db
def test_below_the_limit_a_new_session_starts(
    open_sessions_limit, client_for, owner, colleague, model_id, queued
):
    factories.make_session(owner, status=Session.Status.RUNNING)
    for finished in (Session.Status.WAITING, Session.Status.FAILED, Session.Status.CANCELLED):
        factories.make_session(owner, status=finished)
    response = client_for(colleague).post(
        SESSIONS, {"prompt": "Write hello.py", "model": model_id}, format="json"
    )
    assert response.status_code == 201, response.json()


@pytest.mark.django_db
def test_another_organizations_sessions_do_not_count(
    open_sessions_limit, client_for, owner, stranger, model_id, queued
):
    for _ in range(2):
        factories.make_session(stranger, status=Session.Status.RUNNING)
    response = client_for(owner).post(
        SESSIONS, {"prompt": "Write hello.py", "model": model_id}, format="json"
    )
    assert response.status_code == 201, response.json()


@pytest.mark.django_db
def test_a_follow_up_beyond_the_limit_is_refused_and_the_session_stays_as_it_was(
    open_sessions_limit, client_for, owner, colleague, queued
):
    waiting = factories.make_session(owner, status=Session.Status.WAITING)
    factories.make_event(waiting, 1, "user_message", text="First")
    for _ in range(2):
        factories.make_session(colleague, status=Session.Status.RUNNING)
    response = client_for(owner).post(
        f"{SESSIONS}{waiting.pk}/messages/", {"text": "And now?"}, format="json"
    )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "sessions.organization_limit_reached"
    waiting.refresh_from_db()
    assert waiting.status == Session.Status.WAITING
    assert AgentEvent.objects.filter(session=waiting).count() == 1
    assert queued == []


@pytest.mark.django_db(transaction=True)
def test_two_sessions_started_at_once_cannot_both_take_the_last_place(
    settings, owner, colleague, model_id, queued
):
    settings.QUOR_ORGANIZATION_MAX_OPEN_SESSIONS = 1
    settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES = 0
    start = threading.Barrier(2)
    outcomes = []

    def create(user):
        try:
            start.wait()
            sessions.session_create(user=user, prompt="Hello", model=model_id)
            outcomes.append("created")
        except sessions.SessionLimitReached:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(user,)) for user in (owner, colleague)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["created", "refused"]
    assert Session.objects.count() == 1


# --- sandboxes -----------------------------------------------------------------------------


@pytest.fixture
def one_running_sandbox(settings, colleague):
    settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES = 1
    return factories.make_sandbox(colleague, state=Sandbox.State.RUNNING)


@pytest.mark.django_db
def test_a_session_whose_sandbox_would_be_one_too_many_is_refused(
    one_running_sandbox, client_for, owner, model_id, queued
):
    factories.make_sandbox(owner, state=Sandbox.State.SLEEPING)
    response = client_for(owner).post(
        SESSIONS, {"prompt": "Write hello.py", "model": model_id}, format="json"
    )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "sandboxes.organization_limit_reached"
    assert not Session.objects.filter(owner=owner).exists()


@pytest.mark.django_db
def test_a_sandbox_already_running_keeps_its_place(
    one_running_sandbox, client_for, colleague, model_id, queued
):
    response = client_for(colleague).post(
        SESSIONS, {"prompt": "Write hello.py", "model": model_id}, format="json"
    )
    assert response.status_code == 201, response.json()


@pytest.mark.django_db
def test_asking_to_start_a_sandbox_beyond_the_limit_is_refused(
    one_running_sandbox, client_for, owner
):
    response = client_for(owner).post("/api/v1/sandbox/", {}, format="json")
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "sandboxes.organization_limit_reached"
    assert not Sandbox.objects.filter(user=owner).exists()


@pytest.mark.django_db
def test_waking_a_sandbox_beyond_the_limit_is_refused_before_anything_changes(
    one_running_sandbox, memory_sandboxes, owner
):
    sleeping = factories.make_sandbox(
        owner, backend="memory", state=Sandbox.State.SLEEPING, runtime_credential_hash="before"
    )
    with pytest.raises(services.SandboxLimitReached):
        services.sandbox_ensure_running(sleeping)
    sleeping.refresh_from_db()
    assert (sleeping.state, sleeping.runtime_credential_hash) == (Sandbox.State.SLEEPING, "before")


@pytest.mark.django_db
def test_starting_a_sandbox_beyond_the_limit_is_refused_and_below_it_starts(
    settings, one_running_sandbox, memory_sandboxes, owner
):
    absent = factories.make_sandbox(owner, backend="memory")
    with pytest.raises(services.SandboxLimitReached):
        services.sandbox_ensure_running(absent)
    absent.refresh_from_db()
    assert absent.state == Sandbox.State.ABSENT and absent.runtime_id == ""
    settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES = 2
    assert services.sandbox_ensure_running(absent).state == Sandbox.State.RUNNING


@pytest.mark.django_db
def test_another_organizations_sandboxes_do_not_count(settings, memory_sandboxes, stranger, owner):
    settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES = 1
    factories.make_sandbox(stranger, state=Sandbox.State.RUNNING)
    absent = factories.make_sandbox(owner, backend="memory")
    assert services.sandbox_ensure_running(absent).state == Sandbox.State.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_start_waits_for_one_in_progress_and_counts_it(settings, owner, colleague):
    """The first start holds the organization's lock while it changes its state; the
    second waits for it, then sees it."""
    settings.QUOR_ORGANIZATION_MAX_RUNNING_SANDBOXES = 1
    first = factories.make_sandbox(owner, state=Sandbox.State.SLEEPING)
    second = factories.make_sandbox(colleague, state=Sandbox.State.SLEEPING)
    outcome = []

    def start_second():
        try:
            with services._runtime_slot(second):
                outcome.append("started")
        except services.SandboxLimitReached:
            outcome.append("refused")
        finally:
            connection.close()

    with services._runtime_slot(first):
        thread = threading.Thread(target=start_second)
        thread.start()
        assert waiting_for_an_advisory_lock(), "the second start did not wait"
        services._set_state(first, Sandbox.State.RESTORING)
    thread.join(timeout=60)
    assert outcome == ["refused"]


def waiting_for_an_advisory_lock() -> bool:
    """Whether a connection to the test database waits for an advisory lock (polled:
    the other thread needs a moment to get there)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            if cursor.fetchone()[0]:
                return True
        time.sleep(0.05)
    return False
