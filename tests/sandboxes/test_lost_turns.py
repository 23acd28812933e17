"""Turns whose worker died with their agent are ended, so the session and the sandbox go on."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from sandboxes.models import AgentEvent, Sandbox, Session
from sandboxes.runtime import services
from sandboxes.sessions.services import sessions_fail_lost_turns
from tests import factories


def running_turn(user, *, started_ago: float, sandbox_state=Sandbox.State.RUNNING,
                 sandbox_changed_ago: float = 3600) -> Session:  # fmt: skip
    """A session whose newest turn began `started_ago` seconds ago and is still running,
    in a sandbox that entered `sandbox_state` `sandbox_changed_ago` seconds ago."""
    now = timezone.now()
    sandbox = factories.make_sandbox(
        user, state=sandbox_state, last_activity_at=now - timedelta(hours=2)
    )
    Sandbox.objects.filter(pk=sandbox.pk).update(
        updated_at=now - timedelta(seconds=sandbox_changed_ago)
    )
    session = factories.make_session(user, sandbox=sandbox, status=Session.Status.RUNNING)
    factories.make_event(session, 1, kind="session_started")
    factories.make_event(session, 2, kind="assistant_text", text="working on it")
    session.events.filter(seq=1).update(created_at=now - timedelta(seconds=started_ago))
    return session


def error_codes(session) -> list[str]:
    return [e.payload["code"] for e in AgentEvent.objects.filter(session=session, kind="error")]


@pytest.mark.django_db
def test_a_turn_running_past_its_time_limit_is_ended_as_lost_and_its_sandbox_can_sleep(owner):
    session = running_turn(owner, started_ago=settings.QUOR_AGENT_TURN_TIMEOUT + 400)
    assert not services.sandbox_is_idle(session.sandbox)

    assert sessions_fail_lost_turns() == 1

    session.refresh_from_db()
    assert session.status == Session.Status.FAILED
    assert error_codes(session) == ["agent.lost"]
    assert services.sandbox_is_idle(session.sandbox)
    assert sessions_fail_lost_turns() == 0  # once


@pytest.mark.django_db
def test_a_turn_within_its_time_limit_in_a_running_sandbox_is_left_alone(owner):
    session = running_turn(owner, started_ago=settings.QUOR_AGENT_TURN_TIMEOUT - 60)

    assert sessions_fail_lost_turns() == 0

    session.refresh_from_db()
    assert session.status == Session.Status.RUNNING
    assert error_codes(session) == []


@pytest.mark.django_db
def test_a_turn_whose_sandbox_lost_its_runtime_minutes_ago_is_ended_as_lost(owner):
    session = running_turn(
        owner, started_ago=600, sandbox_state=Sandbox.State.ABSENT, sandbox_changed_ago=300
    )

    assert sessions_fail_lost_turns() == 1

    session.refresh_from_db()
    assert session.status == Session.Status.FAILED
    assert error_codes(session) == ["agent.lost"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("started_ago", "sandbox_changed_ago"),
    [(30, 3600), (600, 30)],
    ids=["turn-just-began", "runtime-just-gone"],
)
def test_a_turn_is_not_ended_in_the_first_minutes_after_its_sandbox_lost_its_runtime(
    owner, started_ago, sandbox_changed_ago
):
    session = running_turn(
        owner, started_ago=started_ago, sandbox_state=Sandbox.State.SLEEPING,
        sandbox_changed_ago=sandbox_changed_ago,
    )  # fmt: skip

    assert sessions_fail_lost_turns() == 0

    session.refresh_from_db()
    assert session.status == Session.Status.RUNNING


@pytest.mark.django_db
def test_only_running_sessions_are_ended(owner):
    session = running_turn(owner, started_ago=settings.QUOR_AGENT_TURN_TIMEOUT + 400)
    Session.objects.filter(pk=session.pk).update(status=Session.Status.PENDING)

    assert sessions_fail_lost_turns() == 0

    session.refresh_from_db()
    assert session.status == Session.Status.PENDING
