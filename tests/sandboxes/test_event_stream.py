"""The live event stream over a real WebSocket stack (Channels, Redis channel layer)."""

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from quor.asgi import application
from sandboxes.sessions.events import session_events_append
from tests import factories
from tests.environment import PORTS
from tests.scenarios import CONNECT_TIMEOUT_S, run_scenario

pytestmark = pytest.mark.django_db(transaction=True)


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def connect(session, cookie=None, after=0):
    headers = [(b"origin", b"http://localhost")]
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/?after={after}", headers=headers
    )


def append(session, *texts):
    session_events_append(session=session, events=[("assistant_text", {"text": t}) for t in texts])


async def receive_seqs(communicator, count):
    return [(await communicator.receive_json_from(timeout=5))["seq"] for _ in range(count)]


def test_a_viewer_gets_the_backlog_then_live_events_in_order(owner):
    session = factories.make_session(owner)
    append(session, "one", "two", "three")
    cookie = cookie_for(owner)

    async def scenario():
        communicator = connect(session, cookie, after=1)
        connected, _ = await communicator.connect(CONNECT_TIMEOUT_S)
        assert connected
        assert await receive_seqs(communicator, 2) == [2, 3]
        from channels.db import database_sync_to_async

        await database_sync_to_async(append)(session, "four", "five")
        assert await receive_seqs(communicator, 2) == [4, 5]
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()

    run_scenario(scenario)


def test_a_reconnecting_viewer_misses_nothing_and_sees_nothing_twice(owner):
    session = factories.make_session(owner)
    cookie = cookie_for(owner)

    async def scenario():
        from channels.db import database_sync_to_async

        first = connect(session, cookie)
        await first.connect(CONNECT_TIMEOUT_S)
        await database_sync_to_async(append)(session, "a", "b")
        assert await receive_seqs(first, 2) == [1, 2]
        await first.disconnect()
        await database_sync_to_async(append)(session, "c")  # while nobody watches
        second, third = connect(session, cookie, after=2), connect(session, cookie, after=0)
        await second.connect(CONNECT_TIMEOUT_S)
        await third.connect(CONNECT_TIMEOUT_S)
        assert await receive_seqs(second, 1) == [3]
        assert await receive_seqs(third, 3) == [1, 2, 3]
        await database_sync_to_async(append)(session, "d")
        assert await receive_seqs(second, 1) == [4]
        assert await receive_seqs(third, 1) == [4]
        await second.disconnect()
        await third.disconnect()

    run_scenario(scenario)


@pytest.mark.parametrize(
    ("who", "code"), [("anonymous", 4401), ("colleague", 4404), ("stranger", 4404)]
)
def test_only_the_owner_may_watch(owner, colleague, stranger, who, code):
    session = factories.make_session(owner)
    user = {"anonymous": None, "colleague": colleague, "stranger": stranger}[who]
    cookie = cookie_for(user) if user else None

    async def scenario():
        communicator = connect(session, cookie)
        connected, close_code = await communicator.connect(CONNECT_TIMEOUT_S)
        assert not connected
        assert close_code == code

    run_scenario(scenario)


def test_a_viewer_misses_nothing_across_a_restart_of_the_web_process(owner, process_env):
    """Events are stored before they are published: a viewer reconnecting to a new
    web process with ?after=SEQ gets what happened while it was away."""
    import json
    import signal
    import subprocess
    import sys

    import websocket

    from tests.docker_helpers import wait_for_port

    session = factories.make_session(owner)
    cookie = cookie_for(owner).decode()

    def start_web():
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(PORTS.EXTRA_WEB),
                "quor.asgi:application",
            ],
            env=process_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port("127.0.0.1", PORTS.EXTRA_WEB)
        return process

    def watch(after):
        return websocket.create_connection(
            f"ws://127.0.0.1:{PORTS.EXTRA_WEB}/ws/sessions/{session.pk}/?after={after}",
            header=[f"Cookie: {cookie}"],
            origin="http://localhost",
            timeout=10,
        )

    web = start_web()
    try:
        viewer = watch(0)
        append(session, "one", "two")
        received = [json.loads(viewer.recv())["seq"] for _ in range(2)]
        web.send_signal(signal.SIGKILL)
        web.wait()
        append(session, "three", "four")  # while no web process runs
        web = start_web()
        viewer = watch(received[-1])
        append(session, "five")
        received += [json.loads(viewer.recv())["seq"] for _ in range(3)]
        assert received == [1, 2, 3, 4, 5]
        viewer.settimeout(0.5)
        with pytest.raises(websocket.WebSocketTimeoutException):
            viewer.recv()
    finally:
        web.kill()
        web.wait()


def test_an_event_whose_live_message_was_lost_still_arrives(owner, monkeypatch):
    """The channel layer may drop messages under load: a quiet viewer finds the
    session's last event in the database by itself."""
    from sandboxes.sessions import events

    session = factories.make_session(owner)
    cookie = cookie_for(owner)

    async def scenario():
        from channels.db import database_sync_to_async

        communicator = connect(session, cookie)
        await communicator.connect(CONNECT_TIMEOUT_S)
        monkeypatch.setattr(events, "_publish", lambda *args: None)  # lost
        await database_sync_to_async(append)(session, "the last word")
        event = await communicator.receive_json_from(timeout=10)
        assert (event["seq"], event["payload"]["text"]) == (1, "the last word")
        await communicator.disconnect()

    run_scenario(scenario)


def test_live_events_reach_a_viewer_while_the_process_sync_thread_is_busy(owner):
    """Thread-sensitive work outside a request (every viewer's, every WebSocket
    connect's user lookup) shares one thread: a viewer's live events must not wait
    for it."""
    import asyncio
    import time

    from asgiref.sync import sync_to_async

    from sandboxes.sessions.events import session_events_publish

    session = factories.make_session(owner)
    cookie = cookie_for(owner)
    live = {"seq": 1, "kind": "assistant_text", "payload": {"text": "live"}, "created_at": "now"}

    async def scenario():
        communicator = connect(session, cookie)
        assert (await communicator.connect(CONNECT_TIMEOUT_S))[0]
        busy = asyncio.ensure_future(sync_to_async(time.sleep)(3))
        await asyncio.sleep(0.2)
        await session_events_publish(session.pk, [live])
        assert await communicator.receive_json_from(timeout=2) == live
        assert not busy.done()
        await busy
        await communicator.disconnect()

    run_scenario(scenario)


def test_a_viewer_that_left_in_the_middle_of_a_burst_does_not_break_the_next_viewers():
    """A receive cancelled while it waits (a viewer disconnecting as events pour in)
    must not break a later burst of events in another scenario (another event loop) of
    this process."""
    import asyncio

    from channels.layers import get_channel_layer

    async def leave_while_receiving():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add("burst", channel)
        waiting = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0.1)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)

    async def receive_a_burst():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add("burst", channel)
        for number in range(5):
            await layer.group_send("burst", {"type": "agent.events", "number": number})
        received = [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(5)]
        assert [message["number"] for message in received] == list(range(5))

    run_scenario(leave_while_receiving)
    run_scenario(receive_a_burst)
