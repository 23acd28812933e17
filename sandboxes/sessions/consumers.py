"""The live event stream of a session, over WebSocket: /ws/sessions/<id>/?after=SEQ.

Everything after SEQ is sent first, then live events, in order, without gaps or
duplicates: the consumer joins the session's group before reading the backlog, and
fills any gap from the database (the truth) when a live event skips ahead. The channel
layer may drop messages under load, so a viewer that got no live event for a few
seconds checks the database: an event never stays undelivered, not even a session's
last one. Its reads run on the web process's kept connections (a new connection per
read cost more than the read).
"""

import asyncio
import time
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from quor.lib.kept_connections import on_kept_connection
from quor.lib.permissions import Permission
from sandboxes import selectors
from sandboxes.sessions.events import serialize_event, session_group
from sandboxes.sessions.sockets import CLOSE_UNAUTHENTICATED, session_of_socket

CATCH_UP_SECONDS = 3
_events_after = on_kept_connection(selectors.events_after)


class SessionEventsConsumer(AsyncJsonWebsocketConsumer):
    required_permission = Permission.SANDBOX_USE

    async def connect(self):
        self.session = await session_of_socket(self)
        if self.session is None:
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        after = query.get("after", ["0"])[0]
        self.last_seq = int(after) if after.isascii() and after.isdigit() else 0
        self.sending = asyncio.Lock()
        self.last_heard = time.monotonic()
        self.group = session_group(self.session.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_from_database()
        self.catch_up = asyncio.create_task(self.catch_up_regularly())

    async def dispatch(self, message):
        """As Channels' own, without its close_old_connections before each message: that
        call waits, for every event and viewer, for the process's one thread of
        thread-sensitive work outside a request, shared by every viewer and every
        WebSocket connect's user lookup (at 50 busy sessions 6 % of the web process's
        time, bench/event_stream.py). This consumer holds no connection there: its reads
        run on kept connections."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code):
        if hasattr(self, "catch_up"):
            self.catch_up.cancel()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if hasattr(self, "viewer_group"):
            await self.channel_layer.group_discard(self.viewer_group, self.channel_name)

    async def catch_up_regularly(self):
        """Reads the database once CATCH_UP_SECONDS passed without a live event or a
        read: while live events come, the stream works and a gap shows in their seqs."""
        while True:
            quiet = time.monotonic() - self.last_heard
            if quiet < CATCH_UP_SECONDS:
                await asyncio.sleep(CATCH_UP_SECONDS - quiet)
                continue
            await self.send_from_database()
            self.last_heard = time.monotonic()

    async def send_from_database(self):
        async with self.sending:
            await self._send_from_database()

    async def _send_from_database(self):
        while True:
            events = await _events_after(self.session, self.last_seq)
            for event in events:
                await self.send_json(serialize_event(event))
                self.last_seq = event.seq
            if len(events) < 1000:
                return

    async def agent_events(self, message):
        self.last_heard = time.monotonic()
        async with self.sending:
            for event in message["events"]:
                if event["seq"] <= self.last_seq:
                    continue  # already sent from the backlog
                if event["seq"] > self.last_seq + 1:
                    await self._send_from_database()  # a gap: the database has it
                    continue
                await self.send_json(event)
                self.last_seq = event["seq"]

    async def viewer_deactivated(self, message):
        """The viewer was deactivated: the stream closes as if they had never logged in."""
        await self.close(code=CLOSE_UNAUTHENTICATED)
