"""Agent turns run in the sandbox, not in a worker: the task that starts a turn returns,
the agent's own events end it, and its heartbeats tell a live turn from a lost one. A
real Celery worker (two processes), real sandboxes, the real proxy and API."""

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from quor.models import ModelProvider
from sandboxes.models import AgentEvent, Session
from sandboxes.runtime import services
from sandboxes.sessions import services as sessions
from tests import factories
from tests.docker_helpers import container_of

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

# The command waits until the test lets it go: every agent is held in its turn at once.
WAIT_FOR_GO = "until [ -e go ]; do sleep 0.1; done; echo released"
SCRIPT = [
    {"tool_calls": [{"name": "run_command", "input": {"command": WAIT_FOR_GO}}]},
    {"text": "Released."},
]


@pytest.fixture
def model_choice(org, upstream_fakes):
    provider = factories.make_provider(
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url="https://model.test:18445",
        api_key="sk-ant-turns-model-key-0123456789", model_names=["scripted"],
    )  # fmt: skip
    upstream_fakes.model.script = SCRIPT
    return f"{provider.pk}:scripted"


@pytest.fixture
def stack(egress_proxy, quor_web, celery_worker, clean_runtimes):
    """Everything a turn needs: the proxy, the Quor API the agent reports to, a worker."""


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)
    return value


def kinds(session) -> list[str]:
    return list(session.events.exclude(kind="assistant_text_delta").values_list("kind", flat=True))


def start_held_turn(user, model_choice) -> Session:
    session = sessions.session_create(user=user, prompt="Wait for go.", model=model_choice)
    wait_until(lambda: "tool_call" in kinds(session), 90, "the agent runs its command")
    return session


def let_go(session: Session) -> None:
    services.session_file_write(session=session, path="go", chunks=[b""], size=0)


def agent_runs(session: Session) -> bool:
    found = services.sandbox_exec(
        user=session.owner,
        argv=["pgrep", "-f", f"^python3 /opt/quor/agent.py --session-id {session.pk}"],
    )
    return found.exit_code == 0


def test_more_turns_than_worker_processes_all_run_at_once_and_all_finish(org, stack, model_choice):
    users = [factories.make_user(org) for _ in range(4)]  # the worker has two processes

    held = [start_held_turn(user, model_choice) for user in users]

    assert all(s.events.filter(kind="tool_result").count() == 0 for s in held)
    assert {Session.objects.get(pk=s.pk).status for s in held} == {Session.Status.RUNNING}
    for session in held:
        let_go(session)
    for session in held:
        wait_until(
            lambda s=session: Session.objects.get(pk=s.pk).status == Session.Status.WAITING,
            60,
            "the turn finishes",
        )
        assert kinds(session)[-3:] == ["tool_result", "assistant_text", "turn_finished"]


def test_a_turn_whose_sandbox_was_killed_is_ended_as_lost_once_its_heartbeats_stop(
    owner, stack, model_choice, docker_client
):
    session = start_held_turn(owner, model_choice)
    first_seen = Session.objects.get(pk=session.pk).agent_seen_at
    wait_until(
        lambda: Session.objects.get(pk=session.pk).agent_seen_at > first_seen,
        4 * settings.QUOR_AGENT_HEARTBEAT_SECONDS,
        "a heartbeat arrives",
    )
    assert sessions.sessions_fail_lost_turns() == 0  # alive: left alone

    container_of(docker_client, session.sandbox).kill()  # behind Quor's back

    wait_until(
        sessions.sessions_fail_lost_turns,
        (sessions.MISSED_HEARTBEATS + 4) * settings.QUOR_AGENT_HEARTBEAT_SECONDS,
        "the sweep finds the turn lost",
    )
    session.refresh_from_db()
    assert session.status == Session.Status.FAILED
    [error] = AgentEvent.objects.filter(session=session, kind="error")
    assert error.payload["code"] == "agent.lost"


def test_a_live_turn_past_its_time_limit_is_ended_as_timed_out_and_its_agent_stopped(
    owner, stack, model_choice
):
    session = start_held_turn(owner, model_choice)
    past_the_limit = timezone.now() - timedelta(seconds=settings.QUOR_AGENT_TURN_TIMEOUT + 1)
    session.events.filter(kind="session_started").update(created_at=past_the_limit)

    assert sessions.sessions_fail_lost_turns() == 1

    session.refresh_from_db()
    assert session.status == Session.Status.FAILED
    [error] = AgentEvent.objects.filter(session=session, kind="error")
    assert error.payload["code"] == "agent.timeout"
    wait_until(lambda: not agent_runs(session), 2, "the agent has stopped")
    held_command = services.sandbox_exec(user=owner, argv=["pgrep", "-f", "until \\[ -e go"])
    assert held_command.exit_code == 1
