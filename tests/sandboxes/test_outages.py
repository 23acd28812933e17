"""The Docker daemon, Redis or PostgreSQL stopped during a session, for real, and started
again the way provisioning starts them: Quor says clearly what is wrong, loses no
recorded event or file, and recovers by itself once the service is back."""

import os
import signal
import subprocess
import time

import pytest
import requests
from django.db import connection

from quor.models import ModelProvider
from sandboxes.models import AgentEvent, Session
from sandboxes.runtime import services
from tests import factories
from tests.environment import PORTS
from tests.sandboxes.test_agent_session_e2e import collect_until
from tests.sandboxes.test_event_stream import cookie_for

pytestmark = [pytest.mark.docker, pytest.mark.serial, pytest.mark.django_db(transaction=True)]


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} after {timeout} s")


def succeeds(argv) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


# --- Docker ---------------------------------------------------------------------------------


def docker_up() -> bool:
    return succeeds(["docker", "info"])


# The daemons start_docker started: children of this process, which must reap them (an
# exited child nobody waits for stays in /proc, and in pgrep's answers, as a zombie).
DAEMONS_STARTED: list[subprocess.Popen] = []


def stop_docker() -> None:
    """Until the process has exited: it stops answering before it has stopped the
    containers, and a new daemon will not start while the old one holds its pid file."""
    pid = int(subprocess.run(["pgrep", "-xo", "dockerd"], capture_output=True, text=True).stdout)
    os.kill(pid, signal.SIGTERM)

    def exited():
        for daemon in DAEMONS_STARTED:
            daemon.poll()
        return not os.path.exists(f"/proc/{pid}")

    wait_until(exited, 90, "the Docker daemon still runs")


def start_docker() -> None:
    """As tools/provision does."""
    with open("/var/log/quor-dockerd.log", "ab") as log:
        DAEMONS_STARTED.append(
            subprocess.Popen(
                ["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    wait_until(docker_up, 90, "the Docker daemon did not come back")


def test_docker_stopped_during_a_session(client_for, owner, running_sandbox):
    api = client_for(owner)
    session = factories.make_session(owner, sandbox=running_sandbox)
    services.session_file_write(session=session, path="notes.txt", chunks=[b"kept"], size=4)
    events_before = api.get(f"/api/v1/sessions/{session.pk}/events/").json()
    stop_docker()
    try:
        listing = api.get(f"/api/v1/sessions/{session.pk}/files/")
        assert listing.status_code == 503
        assert listing.json()["error"]["code"] == "sandboxes.unavailable"
        assert "Docker Engine is not reachable" in listing.json()["error"]["message"]
        assert api.get(f"/api/v1/sessions/{session.pk}/events/").json() == events_before
        ready = api.get("/readyz")
        assert ready.status_code == 503
        assert "sandbox_backend" in ready.content.decode()
    finally:
        start_docker()
    content = api.get(f"/api/v1/sessions/{session.pk}/files/content", {"path": "notes.txt"})
    assert content.status_code == 200  # the runtime is back (started again), the file kept
    assert b"".join(content.streaming_content) == b"kept"


# --- Redis ------------------------------------------------------------------------------------

SCRIPT = [{"text": "Done while you waited."}]


def redis_up() -> bool:
    return succeeds(["redis-cli", "-h", "127.0.0.1", "ping"])


def stop_redis() -> None:
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "shutdown", "save"], capture_output=True)
    wait_until(lambda: not redis_up(), 30, "Redis still answers")


def start_redis() -> None:
    """As tools/provision does."""
    subprocess.run(
        [
            "runuser", "-u", "redis", "--", "redis-server", "--daemonize", "yes",
            "--bind", "127.0.0.1", "--port", "6379", "--dir", "/var/lib/redis",
            "--logfile", "/var/log/redis/quor-redis.log",
        ],
        check=True,
    )  # fmt: skip
    wait_until(redis_up, 30, "Redis did not come back")


def test_viewers_are_served_at_once_after_redis_restarted(owner, quor_web):
    """A restart of Redis kills the web process's pooled connections to it; the next
    viewers must not be the ones to find out (each of their connects used to fail once
    per dead connection, and the page waited seconds to retry)."""
    import json

    import websocket

    session = factories.make_session(owner)
    factories.make_event(session, 1, "assistant_text", text="Hello.")
    cookie = cookie_for(owner).decode()

    def first_event_of_a_new_viewer():
        viewer = websocket.create_connection(
            f"{quor_web.replace('http', 'ws', 1)}/ws/sessions/{session.pk}/?after=0",
            header=[f"Cookie: {cookie}"],
            origin="http://localhost",
            timeout=10,
        )
        try:
            return json.loads(viewer.recv())["seq"]
        finally:
            viewer.close()

    assert [first_event_of_a_new_viewer() for _ in range(3)] == [1, 1, 1]
    stop_redis()
    start_redis()
    assert [first_event_of_a_new_viewer() for _ in range(3)] == [1, 1, 1]


def test_redis_stopped_while_a_session_is_started(
    client_for, owner, org, egress_proxy, celery_worker, clean_runtimes, upstream_fakes
):
    from sandboxes.sessions.services import sessions_requeue_pending

    provider = factories.make_provider(
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url=f"https://model.test:{PORTS.MODEL}",
        model_names=["scripted"],
    )  # fmt: skip
    upstream_fakes.model.script = SCRIPT
    api = client_for(owner)
    stop_redis()
    try:
        created = api.post(
            "/api/v1/sessions/",
            {"prompt": "Do it while Redis is down.", "model": f"{provider.pk}:scripted"},
            format="json",
        )
        assert created.status_code == 201  # recorded; the turn starts once Redis is back
        session = Session.objects.get(pk=created.json()["id"])
        assert session.status == Session.Status.PENDING
        assert AgentEvent.objects.filter(session=session, kind="user_message").count() == 1
        ready = api.get("/readyz")
        assert ready.status_code == 503 and "redis" in ready.content.decode()
    finally:
        start_redis()
    # What beat does every minute: pending turns whose task was lost are queued again.
    assert sessions_requeue_pending(older_than=0) == 1
    events = collect_until(
        cookie_for(owner), session, 0, lambda e: e["kind"] in ("turn_finished", "error")
    )
    assert events[-1]["kind"] == "turn_finished", [e["kind"] for e in events]
    kinds = [e["kind"] for e in events]
    assert kinds.count("user_message") == 1 and kinds.count("session_started") == 1


# --- PostgreSQL ------------------------------------------------------------------------------


def postgresql_cluster() -> list[str]:
    """The Debian cluster serving port 5432 (tools/provision's 18/main)."""
    clusters = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True)
    version, name = next(
        line.split()[:2] for line in clusters.stdout.splitlines() if line.split()[2] == "5432"
    )
    return [version, name]


def postgresql_up() -> bool:
    return succeeds(["pg_isready", "-q"])


def test_postgresql_stopped_during_a_session(owner, quor_web):
    session = factories.make_session(owner)
    from sandboxes.sessions.events import session_events_append

    session_events_append(session=session, events=[("user_message", {"text": "hello"})])
    headers = {"Cookie": cookie_for(owner).decode()}
    url = f"{quor_web}/api/v1/sessions/{session.pk}/events/"
    before = requests.get(url, headers=headers, timeout=10).json()
    cluster = postgresql_cluster()
    connection.close()
    subprocess.run(["pg_ctlcluster", *cluster, "stop", "-m", "fast"], check=True)
    try:
        down = requests.get(url, headers=headers, timeout=10)
        assert down.status_code == 503
        assert down.json()["error"]["code"] == "service.database_unavailable"
    finally:
        subprocess.run(["pg_ctlcluster", *cluster, "start"], check=True)
        wait_until(postgresql_up, 30, "PostgreSQL did not come back")
    # The web process reconnects by itself; nothing recorded was lost.
    wait_until(lambda: requests.get(url, headers=headers, timeout=10).status_code == 200, 20,
               "the web process did not recover")  # fmt: skip
    assert requests.get(url, headers=headers, timeout=10).json() == before
