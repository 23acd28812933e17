"""Agent turns run in the sandbox, not in a worker: the task that starts a turn returns,
the agent's own events end it, and its heartbeats tell a live turn from a lost one. A
real Celery worker (two processes), real sandboxes, the real proxy and API."""

import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from quor.models import ModelProvider
from sandboxes import image
from sandboxes.backends import get_backend
from sandboxes.image import SESSIONS_DIR, WORKSPACE
from sandboxes.models import AgentEvent, Session
from sandboxes.runtime import services
from sandboxes.sessions import services as sessions
from tests import factories
from tests.docker_helpers import container_of
from tests.environment import PORTS

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
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url=f"https://model.test:{PORTS.MODEL}",
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


def the_error_that_ended(session: Session) -> dict:
    session.refresh_from_db()
    assert session.status == Session.Status.FAILED
    [error] = AgentEvent.objects.filter(session=session, kind="error")
    return error.payload


def start_held_turn(user, model_choice) -> Session:
    session = sessions.session_create(user=user, prompt="Wait for go.", model=model_choice)
    wait_until(lambda: "tool_call" in kinds(session), 90, "the agent runs its command")
    return session


def let_go(session: Session) -> None:
    services.session_file_write(session=session, path="go", chunks=[b""], size=0)


def agent_runs(session: Session) -> bool:
    return agents_of(session) != ""


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
    assert the_error_that_ended(session)["code"] == "agent.lost"


def test_a_live_turn_past_its_time_limit_is_ended_as_timed_out_and_its_agent_stopped(
    owner, stack, model_choice
):
    session = start_held_turn(owner, model_choice)
    past_the_limit = timezone.now() - timedelta(seconds=settings.QUOR_AGENT_TURN_TIMEOUT + 1)
    session.events.filter(kind="session_started").update(created_at=past_the_limit)

    assert sessions.sessions_fail_lost_turns() == 1

    assert the_error_that_ended(session)["code"] == "agent.timeout"
    wait_until(lambda: not agent_runs(session), 2, "the agent has stopped")
    held_command = services.sandbox_exec(user=owner, argv=["pgrep", "-f", "until \\[ -e go"])
    assert held_command.exit_code == 1


def agents_of(session: Session) -> str:
    """The command lines of the session's agents running in its sandbox."""
    found = services.sandbox_exec(
        user=session.owner, argv=["pgrep", "-a", "-f", image.agent_pattern(str(session.pk))]
    )
    return found.stdout.decode()


def test_an_agent_that_dies_without_a_word_is_ended_as_crashed_with_its_exit_status(
    owner, stack, model_choice
):
    session = start_held_turn(owner, model_choice)
    killed = services.sandbox_exec(
        user=owner, argv=["pkill", "-KILL", "-f", image.agent_pattern(str(session.pk))]
    )
    assert killed.exit_code == 0

    wait_until(
        sessions.sessions_fail_lost_turns,
        (sessions.QUIET_HEARTBEATS + 4) * settings.QUOR_AGENT_HEARTBEAT_SECONDS,
        "the sweep finds the agent gone",
    )
    error = the_error_that_ended(session)
    assert error["code"] == "agent.crashed"
    assert "exit status 137" in error["message"]


def test_an_agent_that_could_not_reach_quor_but_still_works_keeps_its_turn(
    owner, stack, model_choice
):
    session = start_held_turn(owner, model_choice)
    long_ago = timezone.now() - timedelta(minutes=10)  # its heartbeats never arrived
    Session.objects.filter(pk=session.pk).update(agent_seen_at=long_ago)

    assert sessions.sessions_fail_lost_turns() == 0

    session.refresh_from_db()
    assert session.status == Session.Status.RUNNING
    assert session.agent_seen_at > long_ago
    assert agent_runs(session)
    let_go(session)
    wait_until(
        lambda: Session.objects.get(pk=session.pk).status == Session.Status.WAITING,
        60,
        "the turn finishes",
    )


def test_starting_an_agent_stops_the_sessions_left_over_one_and_records_its_exit(
    running_sandbox,
):
    """The start script, in a real sandbox: an agent of the session still running (its
    turn ended while it could not be told) is stopped; the new one's output and exit
    status land in the session's directory (here it exits at once: Quor knows no such
    session)."""
    backend, sandbox_id = get_backend(), str(running_sandbox.pk)
    session_id, directory = str(uuid.uuid4()), f"{SESSIONS_DIR}/{uuid.uuid4()}"

    def run(argv):
        return backend.exec(sandbox_id, argv, cwd=WORKSPACE, env={}, timeout_s=30,
                            output_limit=1 << 16)  # fmt: skip

    assert run(image.make_session_directory_argv(directory)).exit_code == 0
    backend.write_file(sandbox_id, directory, image.NEXT_MESSAGE, [b"Hello"], 5)
    left_over = f"{' '.join(image.agent_argv(session_id, directory, 1))} "
    other_id = str(uuid.uuid4())
    other_session = f"{' '.join(image.agent_argv(other_id, directory, 1))} "
    for name in (left_over, other_session):  # processes whose command lines say so
        run(["setsid", "-f", "bash", "-c", 'exec -a "$0" sleep 60', name])
    # setsid -f returns before its child has exec'd under the new name: wait for both.
    for pattern in (image.agent_pattern(session_id), image.agent_pattern(other_id)):
        wait_until(lambda p=pattern: run(["pgrep", "-f", p]).exit_code == 0, 10, f"{pattern} runs")

    started = backend.exec(
        sandbox_id,
        image.start_agent_argv(session_id, directory, 2, time_limit_s=60),
        cwd=WORKSPACE,
        env=services.sandbox_identity_environment(running_sandbox),
        timeout_s=30,
        output_limit=1 << 16,
    )

    assert started.exit_code == 0
    state = wait_until(
        lambda: (
            (out := run(image.agent_state_argv(session_id, directory)).stdout.decode()).startswith(
                "exited"
            )
            and out
        ),
        10,
        "the new agent has exited",
    )
    assert state.startswith("exited 3\n")
    assert "agent: Could not post events to Quor" in state  # its stderr, from its log
    assert run(["pgrep", "-f", image.agent_pattern(session_id)]).exit_code == 1  # stopped
    assert run(["pgrep", "-f", image.agent_pattern(other_id)]).exit_code == 0  # not its own
