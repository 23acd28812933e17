"""Every Quor process serves Prometheus metrics on QUOR_METRICS_PORT. Scraped over HTTP
from real processes: the web tier (two daphne processes), a Celery worker whose two prefork
children run the tasks, beat, the egress proxy with two acceptor processes, and the web
app proxy. Then what the services record, read in this process."""

import http.client
import socket
import sys
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from approvals.models import ApprovalRequest
from quor.celery import app
from quor.lib import metrics
from sandboxes.models import Sandbox, Session
from sandboxes.sessions.services import session_events_report, sessions_fail_lost_turns
from tests import factories
from tests.docker_helpers import (
    host_ipv4_addresses,
    wait_for_egress_proxy,
    wait_for_http,
    wait_for_port,
)
from tests.environment import free_port
from tests.quor.running import (
    Processes,
    celery_worker,
    eventually,
    sample,
    scrape,
    web,
)


@pytest.fixture
def processes(process_env, tmp_path):
    running = Processes(process_env, tmp_path)
    yield running
    running.stop_all()


def test_every_metric_has_labels_so_that_a_process_can_switch_to_multiprocess_mode_later():
    """A metric without labels makes its value when it is defined: in the egress proxy
    and the Celery worker (which import this module while Django starts) it would miss
    the switch to multi-process mode, and its children's counts would be lost."""
    defined = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(defined) >= 10
    for metric in defined:
        assert metric._name.startswith("quor_")
        assert metric._labelnames, metric._name


@pytest.mark.django_db(transaction=True)
def test_the_web_tier_counts_api_errors_of_all_its_processes_and_serves_gauges_from_postgresql(
    owner, processes
):
    factories.make_sandbox(owner, state="sleeping")
    session = factories.make_session(owner, status="running")
    ApprovalRequest.objects.create(
        session=session, app_name="Forge", actions=[], method="POST", url="https://apps.test/",
        summary="Forge: issues.create", expires_at=timezone.now() + timedelta(minutes=5),
    )  # fmt: skip
    web_port, metrics_port = free_port(), free_port()
    processes.start("web", web(web_port), QUOR_METRICS_PORT=str(metrics_port))
    # Its parent listens before its daphne processes have loaded Django: one must answer.
    wait_for_http(f"http://127.0.0.1:{web_port}/healthz")

    for _ in range(2):
        connection = http.client.HTTPConnection("127.0.0.1", web_port, timeout=10)
        connection.request("GET", "/api/v1/no-such-endpoint/")
        assert connection.getresponse().status == 404

    samples = scrape(metrics_port)
    assert sample(samples, "quor_api_errors_total", code="not_found") == 2
    assert sample(samples, "quor_sandboxes", state="sleeping", network_policy="open") == 1
    assert sample(samples, "quor_sandboxes", state="running", network_policy="open") == 0
    assert sample(samples, "quor_agent_turns", status="running") == 1
    assert sample(samples, "quor_agent_turns", status="pending") == 0
    assert sample(samples, "quor_approvals_waiting") == 1


@pytest.mark.django_db(transaction=True)
def test_a_task_run_by_a_prefork_child_is_counted_in_the_worker_main_process_metrics(
    owner, processes
):
    """The worker's main process runs no task: what shows in its exposition was recorded
    by a pool child, in multi-process mode."""
    session = factories.make_session(owner)
    parked = ApprovalRequest.objects.create(
        session=session, app_name="Forge", actions=[], method="POST", url="https://apps.test/",
        summary="Forge: issues.create", expires_at=timezone.now() - timedelta(seconds=30),
    )  # fmt: skip
    ApprovalRequest.objects.filter(pk=parked.pk).update(
        created_at=timezone.now() - timedelta(minutes=10)
    )
    queue, metrics_port = f"metrics-test-{uuid.uuid4().hex[:8]}", free_port()
    log = processes.start("worker", celery_worker(queue), QUOR_METRICS_PORT=str(metrics_port))
    wait_for_port("127.0.0.1", metrics_port, log=log)

    app.send_task("approvals.tasks.expire_stale_approvals", queue=queue)

    task = {"task": "approvals.tasks.expire_stale_approvals", "state": "success"}
    samples = eventually(metrics_port, "quor_celery_tasks_total", 1, **task)
    assert sample(samples, "quor_celery_tasks_total", **task) == 1, log.read_text()
    assert sample(samples, "quor_approval_wait_seconds_count", status="expired") == 1
    waited = sample(samples, "quor_approval_wait_seconds_sum", status="expired")
    assert 600 <= waited < 700
    assert ApprovalRequest.objects.get().status == ApprovalRequest.Status.EXPIRED


def start_beat(processes, tmp_path, **environment) -> int:
    """Celery beat serving its metrics; returns their port once it listens on loopback."""
    metrics_port = free_port()
    log = processes.start(
        "beat",
        [sys.executable, "-m", "celery", "-A", "quor", "beat", "--loglevel", "WARNING",
         "-S", "celery.beat:PersistentScheduler", "-s", str(tmp_path / "schedule")],
        QUOR_METRICS_PORT=str(metrics_port), **environment,
    )  # fmt: skip
    wait_for_port("127.0.0.1", metrics_port, log=log)
    return metrics_port


def test_beat_serves_its_metrics(processes, tmp_path):
    samples = scrape(start_beat(processes, tmp_path))
    assert sample(samples, "process_start_time_seconds") > 0


def test_metrics_bind_only_the_configured_address(processes, tmp_path):
    metrics_port = start_beat(processes, tmp_path, QUOR_METRICS_ADDRESS="127.0.0.1")
    others = host_ipv4_addresses()
    assert others  # docker0 at least
    for address in others:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, metrics_port), timeout=3).close()


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_the_egress_proxy_counts_a_decision_made_in_an_acceptor_process(processes, tmp_path):
    """A connection from the host's own address on the sandbox bridge: no sandbox has
    it, so an acceptor process refuses it, and the proxy's main process counts it."""
    from sandboxes.backends.docker import DockerBackend

    host, port, metrics_port = DockerBackend().egress_proxy_address(), free_port(), free_port()
    started = time.time()
    log = processes.start(
        "egress-proxy",
        [sys.executable, "manage.py", "run_egress_proxy", "--acceptors", "2"],
        QUOR_EGRESS_PROXY_PORT=str(port),
        QUOR_METRICS_PORT=str(metrics_port),
        QUOR_EXTRA_CA_BUNDLE="",
        # A CA directory of its own: the upstream trust it writes there (without the
        # tests' upstream CA) must not replace the one the session's proxy reads.
        QUOR_EGRESS_CA_DIR=str(tmp_path / "egress-ca"),
    )
    wait_for_egress_proxy(processes.started[-1], f"{host}:{port}", started, log)

    with socket.create_connection((host, port), timeout=30) as client:
        client.sendall(b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 403")

    decision = {
        "outcome": "blocked",
        "code": "egress.unidentified_sandbox",
        "network_policy": "unknown",
    }
    samples = eventually(metrics_port, "quor_egress_decisions_total", 1, **decision)
    assert sample(samples, "quor_egress_decisions_total", **decision) == 1, log.read_text()


def test_the_web_app_proxy_counts_requests_by_status_class(processes):
    port, metrics_port = free_port(), free_port()
    log = processes.start(
        "webapp-proxy",
        [sys.executable, "manage.py", "run_webapp_proxy", "--bind", f"127.0.0.1:{port}"],
        QUOR_METRICS_PORT=str(metrics_port),
    )
    wait_for_port("127.0.0.1", port, log=log)

    for _ in range(3):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/", headers={"Host": "not-a-web-app.example"})
        assert connection.getresponse().status == 404

    samples = scrape(metrics_port)
    assert sample(samples, "quor_webapp_proxy_requests_total", status_class="4xx") == 3
    assert sample(samples, "quor_webapp_proxy_requests_total", status_class="2xx") is None


# --- what the services record (in this process, the default registry) ---------------------


def recorded(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0


def running_turn(user, *, started_ago: float, sandbox_state="running") -> Session:
    sandbox = factories.make_sandbox(user, state=sandbox_state)
    Sandbox.objects.filter(pk=sandbox.pk).update(
        updated_at=timezone.now() - timedelta(seconds=started_ago)
    )
    session = factories.make_session(user, sandbox=sandbox, status=Session.Status.RUNNING)
    factories.make_event(session, 1, kind="session_started")
    session.events.filter(seq=1).update(created_at=timezone.now() - timedelta(seconds=started_ago))
    return session


@pytest.mark.django_db
def test_a_turn_the_agent_ends_is_timed_and_its_events_are_counted_by_kind(owner):
    session = running_turn(owner, started_ago=120)
    before = {
        "text": recorded("quor_session_events_ingested_total", kind="assistant_text"),
        "finished": recorded("quor_session_events_ingested_total", kind="turn_finished"),
        "count": recorded("quor_agent_turn_duration_seconds_count", outcome="finished"),
        "sum": recorded("quor_agent_turn_duration_seconds_sum", outcome="finished"),
    }

    events = [{"kind": "assistant_text", "payload": {"text": t}} for t in ("a", "b")]
    session_events_report(session=session, events=[*events, {"kind": "turn_finished"}])
    # A late report of the same end changes nothing: the turn ended once.
    session_events_report(session=session, events=[{"kind": "turn_finished"}])

    ingested = recorded("quor_session_events_ingested_total", kind="assistant_text")
    assert ingested - before["text"] == 2
    ended = recorded("quor_session_events_ingested_total", kind="turn_finished")
    assert ended - before["finished"] == 2
    count = recorded("quor_agent_turn_duration_seconds_count", outcome="finished")
    assert count - before["count"] == 1
    took = recorded("quor_agent_turn_duration_seconds_sum", outcome="finished") - before["sum"]
    assert 120 <= took < 180


@pytest.mark.django_db
def test_a_turn_quor_ends_as_lost_is_counted_by_its_code(owner):
    running_turn(owner, started_ago=600, sandbox_state="absent")
    lost = recorded("quor_agent_turn_failures_total", code="agent.lost")
    failed = recorded("quor_agent_turn_duration_seconds_count", outcome="failed")

    assert sessions_fail_lost_turns() == 1

    assert recorded("quor_agent_turn_failures_total", code="agent.lost") == lost + 1
    assert recorded("quor_agent_turn_duration_seconds_count", outcome="failed") == failed + 1


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_a_start_a_sleep_a_wake_and_a_lost_runtime_are_recorded(owner, running_sandbox):
    """running_sandbox was started by the fixture: one start recorded before the test."""
    from sandboxes.backends.docker import DockerBackend
    from sandboxes.runtime import services

    def operations(operation):
        return recorded(
            "quor_sandbox_operation_duration_seconds_count", operation=operation, outcome="ok"
        )

    starts, sleeps, wakes = operations("start"), operations("sleep"), operations("wake")
    snapshot_bytes = recorded("quor_snapshot_size_bytes_sum", backend="docker")
    lost = recorded("quor_sandbox_runtimes_lost_total", recorded_as="absent")
    assert starts >= 1

    snapshot = services.sandbox_sleep(sandbox=running_sandbox, force=True)
    services.sandbox_ensure(user=owner)
    DockerBackend().destroy(str(running_sandbox.pk), remove_workspace=False)
    services.sandbox_refresh_state(running_sandbox)

    assert (operations("start"), operations("sleep"), operations("wake")) == (
        starts,
        sleeps + 1,
        wakes + 1,
    )
    assert recorded("quor_snapshot_size_bytes_sum", backend="docker") == (
        snapshot_bytes + snapshot.size
    )
    assert recorded("quor_sandbox_runtimes_lost_total", recorded_as="absent") == lost + 1
