"""`manage.py serve_web`, the web tier as deployed: several daphne processes accepting
on one socket, each replaced when it dies, all stopped together; and a session's
events reach viewers whichever web process stored them."""

import json
import os
import signal
import socket
import time
import urllib.request

import pytest
import websocket
from django.core.management import CommandError, call_command

from sandboxes.sessions.events import session_events_append
from tests import factories
from tests.docker_helpers import wait_for_port
from tests.quor.running import Processes, free_port, web
from tests.sandboxes.test_event_stream import cookie_for


@pytest.fixture
def processes(process_env, tmp_path):
    started = Processes(process_env, tmp_path)
    yield started
    started.stop_all()


def daphne_processes(pid: int) -> list[int]:
    return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} after {timeout} s")


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
        return response.status


def serve(processes, port: int) -> int:
    """Starts serve_web with two processes; its pid once both accept."""
    log = processes.start("web", web(port))
    wait_for_port("127.0.0.1", port, log=log)
    parent = processes.started[-1].pid
    wait_until(lambda: len(daphne_processes(parent)) == 2, 30, "two daphne processes")
    return parent


def test_a_web_process_that_dies_is_replaced_and_the_other_serves_meanwhile(processes):
    port = free_port()
    parent = serve(processes, port)
    first, second = daphne_processes(parent)

    os.kill(first, signal.SIGKILL)
    assert [healthz(port) for _ in range(20)] == [200] * 20

    def replaced():
        now = daphne_processes(parent)
        return len(now) == 2 and first not in now and second in now

    wait_until(replaced, 30, "the killed process was not replaced")


def test_a_stop_ends_every_web_process(processes):
    port = free_port()
    parent = serve(processes, port)
    children = daphne_processes(parent)

    os.kill(parent, signal.SIGTERM)
    assert processes.started[-1].wait(timeout=30) == 0
    for child in children:
        assert not os.path.exists(f"/proc/{child}")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=3).close()


@pytest.mark.django_db(transaction=True)
def test_viewers_in_every_web_process_get_events_stored_by_another_process(owner, processes):
    """Four viewers (the kernel spreads them over both processes as it likes; each has
    joined its session's group once its handshake is answered) and the events stored
    and published here, a process of its own."""
    port = free_port()
    serve(processes, port)
    session = factories.make_session(owner)
    cookie = cookie_for(owner).decode()
    viewers = [
        websocket.create_connection(
            f"ws://127.0.0.1:{port}/ws/sessions/{session.pk}/?after=0",
            header=[f"Cookie: {cookie}"],
            origin="http://localhost",
            timeout=10,
        )
        for _ in range(4)
    ]

    session_events_append(
        session=session, events=[("assistant_text", {"text": f"part {n}"}) for n in range(3)]
    )

    for viewer in viewers:
        assert [json.loads(viewer.recv())["seq"] for _ in range(3)] == [1, 2, 3]
        viewer.close()


def test_serve_web_refuses_no_processes_and_a_taken_port():
    with pytest.raises(CommandError, match="at least 1"):
        call_command("serve_web", processes=0, port=free_port())
    with (
        socket.create_server(("127.0.0.1", 0)) as taken,
        pytest.raises(CommandError, match=r"cannot listen on 127\.0\.0\.1:\d+: Address already"),
    ):
        call_command("serve_web", processes=1, port=taken.getsockname()[1])
