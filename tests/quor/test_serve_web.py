"""`manage.py serve_web`, the web tier as deployed: several daphne processes accepting
on one socket, each replaced when it dies, all stopped together; and a session's
events reach viewers whichever web process stored them."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import websocket
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command

from quor.management.commands.serve_web import WebProcesses
from sandboxes.sessions.events import session_events_publish
from tests import factories
from tests.docker_helpers import wait_for_http
from tests.environment import free_port
from tests.quor.running import Processes, web
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
    """Starts serve_web with two processes; its pid once both run and one answers."""
    processes.start("web", web(port))
    wait_for_http(f"http://127.0.0.1:{port}/healthz")
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


class ProcessesThatDieAtStart(WebProcesses):
    def start_one(self):
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), time.monotonic()


def test_the_web_tier_gives_up_when_its_processes_die_as_they_start():
    """Restarting them for ever (the application does not load, for instance) would hide
    it from the container's supervisor: serve_web then exits with an error."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        assert ProcessesThatDieAtStart(listener, 2).run() is False


def serving_process(children: list[int], port: int, viewer) -> int:
    """Which of the daphne processes holds the server side of the viewer's connection."""
    client_port = viewer.sock.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == client_port:
            for pid in children:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                            return pid
    raise AssertionError(f"no daphne process holds the connection from port {client_port}")


@pytest.mark.django_db(transaction=True)
def test_viewers_in_every_web_process_get_what_another_process_publishes(owner, processes):
    """Viewers are opened until both processes have some (the kernel spreads them as it
    likes); then an event is published from this process (another one) without being
    stored, so that only the live path can bring it: no viewer could read it from the
    database."""
    port = free_port()
    parent = serve(processes, port)
    children = daphne_processes(parent)
    session = factories.make_session(owner)
    factories.make_event(session, 1, "assistant_text", text="Hello.")
    cookie = cookie_for(owner).decode()
    viewers, holders = [], set()
    while holders != set(children):
        assert len(viewers) < 40, f"every viewer went to {holders}"
        viewer = websocket.create_connection(
            f"ws://127.0.0.1:{port}/ws/sessions/{session.pk}/?after=0",
            header=[f"Cookie: {cookie}"],
            origin="http://localhost",
            timeout=10,
        )
        assert json.loads(viewer.recv())["seq"] == 1  # the backlog: it has joined the group
        viewers.append(viewer)
        holders.add(serving_process(children, port, viewer))

    live = {"seq": 2, "kind": "assistant_text", "payload": {"text": "live"}, "created_at": ""}
    async_to_sync(session_events_publish)(session.pk, [live])

    for viewer in viewers:
        assert json.loads(viewer.recv())["payload"] == {"text": "live"}
        viewer.close()


def test_serve_web_refuses_no_processes_and_a_taken_port():
    with pytest.raises(CommandError, match="at least 1"):
        call_command("serve_web", processes=0, port=free_port())
    with (
        socket.create_server(("127.0.0.1", 0)) as taken,
        pytest.raises(CommandError, match=r"cannot listen on 127\.0\.0\.1:\d+: Address already"),
    ):
        call_command("serve_web", processes=1, port=taken.getsockname()[1])
