"""The session's terminal over WebSocket: /ws/sessions/<id>/terminal/?cols=C&rows=R.

The session's owner only (who may use a sandbox): anyone else is refused before the
socket opens. Binary frames from the server are what the PTY sent; text frames from the
browser are JSON, `{"input": "..."}` or `{"resize": [cols, rows]}`, at most
MAX_MESSAGE_BYTES each. One connection per session shows the terminal: a new one (a
reconnect, another tab) closes the older with CLOSE_REPLACED. When the shell ends the
socket closes with CLOSE_ENDED, after a text frame `{"closed": reason}` saying why; the
browser attaches again after any other close.
"""

import asyncio
import codecs
import json
import threading
import time
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import connection

from quor.lib.errors import QuorError
from quor.lib.kept_connections import on_kept_connection
from quor.lib.permissions import Permission
from sandboxes.runtime import services as runtime
from sandboxes.sessions.sockets import CLOSE_UNAUTHENTICATED, session_of_socket
from sandboxes.terminal import markers, services

CLOSE_ENDED = 4000
CLOSE_ATTACH_AGAIN = 4001  # the attachment reached ATTACHMENT_MAX_S
CLOSE_INVALID = 4400
CLOSE_REPLACED = 4409
CLOSE_UNAVAILABLE = 4503
CLOSE_TOO_BIG = 4413  # not 1009: daphne (autobahn) sends only 1000 and 3000-4999
MAX_MESSAGE_BYTES = 64 * 1024
OPENED_ELSEWHERE = "The terminal was opened elsewhere."
# Typing marks the sandbox in use at most this often (one write each time).
TOUCH_EVERY_S = 30

_output_record = on_kept_connection(services.terminal_output_record)
_commands_record = on_kept_connection(services.terminal_commands_record)
_sandbox_touch = on_kept_connection(runtime.sandbox_touch)


def _on_own_connection(function):
    """For slow work (starting a sandbox, writing the asciicast file): a thread and a
    database connection of its own, closed after, so that it holds up neither the kept
    connections nor Channels' one thread."""

    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(run, thread_sensitive=False)


_attach = _on_own_connection(services.terminal_attach)
_detach = _on_own_connection(services.terminal_detach)
_end = _on_own_connection(services.terminal_end)


class TerminalConsumer(AsyncWebsocketConsumer):
    required_permission = Permission.SANDBOX_USE
    attachment = None
    closing = False

    async def close(self, code=None, reason=None):
        """Once: the PTY's end and a message saying why may both close it. The reason
        goes first in a text frame, `{"closed": reason}`: daphne drops a close frame's."""
        if self.closing:
            return
        self.closing = True
        if reason:
            await self.send(text_data=json.dumps({"closed": reason}))
        await super().close(code=code)

    async def connect(self):
        session = await session_of_socket(self)
        if session is None:
            return
        user = self.scope["user"]
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            cols, rows = services.clean_terminal_size(
                query.get("cols", [""])[0], query.get("rows", [""])[0]
            )
        except QuorError:
            await self.close(code=CLOSE_INVALID)
            return
        self.group = services.terminal_group(session.pk)
        await self.channel_layer.group_send(
            self.group, {"type": "terminal.replaced", "channel": self.channel_name}
        )
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        try:
            self.attachment = await _attach(user=user, session=session, cols=cols, rows=rows)
        except QuorError as exc:
            await self.close(code=CLOSE_UNAVAILABLE, reason=exc.message)
            return
        self.detached = asyncio.Event()
        self.last_touch = time.monotonic()
        self.output = asyncio.Queue()
        loop = asyncio.get_running_loop()
        threading.Thread(
            target=self._read_pty, args=(loop,), name="terminal-pty", daemon=True
        ).start()
        self.pump = asyncio.create_task(self._show_and_record())
        self.time_limit = asyncio.create_task(self._attach_again_later())

    def _read_pty(self, loop):
        """A thread per attachment: the PTY's reads block."""
        terminal = self.attachment.terminal
        while True:
            data = terminal.read()
            loop.call_soon_threadsafe(self.output.put_nowait, data)
            if not data:
                return

    async def _show_and_record(self):
        """Each piece the PTY sent is shown, then stored (the recording holds what was
        shown) and read for the shell's command markers; at the end of the PTY, the
        attachment ends and the socket says why."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        reader = markers.MarkerReader()
        limit = settings.QUOR_TERMINAL_RECORDING_MAX_BYTES
        while data := await self.output.get():
            if self.closing:
                return  # the disconnect ends the attachment
            await self.send(bytes_data=data)
            text = decoder.decode(data)
            if text and await _output_record(self.attachment, text) > limit:
                # Nothing more is shown unrecorded: the shell ends, the socket closes.
                await _end(session_id=self.attachment.session_id, reason=services.ENDED_BY_SIZE)
                return
            if events := reader.feed(data):
                await _commands_record(self.attachment, events)
        if self.detached.is_set():
            return  # this side ended it: the socket is closing already
        reason = await self._detach()
        if reason:
            await self.close(code=CLOSE_ENDED, reason=reason)
        else:  # the shell lives: another attachment detached this one (`-D`)
            await self.close(code=CLOSE_REPLACED, reason=OPENED_ELSEWHERE)

    async def _attach_again_later(self):
        await asyncio.sleep(services.ATTACHMENT_MAX_S)
        await self.close(code=CLOSE_ATTACH_AGAIN)

    async def _detach(self) -> str:
        """Once per attachment, whoever ends it first."""
        if self.attachment is None or self.detached.is_set():
            return ""
        self.detached.set()
        return await _detach(self.attachment)

    async def receive(self, text_data=None, bytes_data=None):
        if self.attachment is None:
            return
        message = text_data if text_data is not None else bytes_data.decode(errors="replace")
        if len(message.encode()) > MAX_MESSAGE_BYTES:
            await self.close(code=CLOSE_TOO_BIG)
            return
        try:
            command = json.loads(message)
            if not isinstance(command, dict):
                raise ValueError
            if "input" in command:
                data = command["input"]
                if not isinstance(data, str):
                    raise ValueError
                await asyncio.to_thread(services.terminal_input, self.attachment, data.encode())
                await self._touch()
            elif "resize" in command:
                cols, rows = command["resize"]
                await _on_own_connection(services.terminal_resize)(
                    self.attachment, cols=cols, rows=rows
                )
            else:
                raise ValueError
        except (ValueError, TypeError, QuorError):
            await self.close(code=CLOSE_INVALID)

    async def _touch(self):
        if time.monotonic() - self.last_touch > TOUCH_EVERY_S:
            self.last_touch = time.monotonic()
            await _sandbox_touch(self.attachment.sandbox_id)

    async def terminal_replaced(self, message):
        if message["channel"] != self.channel_name:
            await self.close(code=CLOSE_REPLACED, reason=OPENED_ELSEWHERE)

    async def terminal_ended(self, message):
        await self.close(code=CLOSE_ENDED, reason=message["reason"])

    async def viewer_deactivated(self, message):
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def disconnect(self, code):
        for name in ("viewer_group", "group"):
            if hasattr(self, name):
                await self.channel_layer.group_discard(getattr(self, name), self.channel_name)
        if self.attachment is not None:
            self.time_limit.cancel()
            await self._detach()
