"""The runtime's progress reports, served before Django's request cycle.

A busy session reports up to ten times a second and most reports are plain progress of
its running turn; the full cycle (middleware, DRF, eight ORM queries, a new database
connection) cost about 23 ms of the web process's CPU and 15 ms of PostgreSQL's for
each (docs/performance.md, event stream). This stores those in two statements on a kept
connection and hands every other request, and every report it does not store, to
Django unchanged: the view (RuntimeSessionEventsView) then stores it or explains the
refusal as before."""

import json
import logging
import re
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError

from quor.lib import logs
from quor.lib.kept_connections import on_kept_connection
from sandboxes.sessions.events import session_events_publish
from sandboxes.sessions.services import session_progress_report

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("quor.access")
REPORT_PATH = re.compile(r"/api/v1/runtime/sessions/(?P<session>[^/]+)/events/")
_store = on_kept_connection(session_progress_report)


class RuntimeProgressReports:
    """ASGI: stores and publishes the progress reports it can, passes on the rest."""

    def __init__(self, django_app):
        self.django_app = django_app

    async def __call__(self, scope, receive, send):
        match = REPORT_PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST":
            return await self.django_app(scope, receive, send)
        started = time.monotonic()
        headers = dict(scope["headers"])
        limit = settings.QUOR_MAX_REQUEST_BYTES
        body, more_body = await _read_body(receive, limit)
        if body is None:
            return  # the client left
        keyword, _, credential = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        whole = not more_body and len(body) <= limit
        report = _json(body) if whole and _is_json(headers) else None
        stored = None
        if keyword == "Bearer" and credential.strip() and report is not None:
            try:
                stored = await _store(
                    session_id=match["session"], credential=credential.strip(), report=report
                )
            except (OperationalError, InterfaceError):
                stored = None  # the view answers, on a connection of its own
        if stored is None:
            return await self.django_app(scope, _replaying(body, more_body, receive), send)
        try:
            await session_events_publish(match["session"], stored)
        except Exception:  # stored: viewers read it from the database (as on_commit's robust)
            logger.exception(
                "the events of session %s were stored but not published", match["session"]
            )
        request_id = logs.request_id_from(headers.get(b"x-request-id", b"").decode("latin-1"))
        response = json.dumps({"last_seq": stored[-1]["seq"]}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(response)).encode()),
                    (b"x-request-id", request_id.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": response})
        token = logs.request_id.set(request_id)
        try:
            access_logger.info(
                "POST %s 200 %.0fms", scope["path"], (time.monotonic() - started) * 1000
            )
        finally:
            logs.request_id.reset(token)


async def _read_body(receive, limit: int) -> tuple[bytes | None, bool]:
    """The body, read until its end or past `limit` bytes, and whether more of it is
    still to be received. None if the client left."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, False
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit or not message.get("more_body"):
            return b"".join(chunks), bool(message.get("more_body"))


def _replaying(body: bytes, more_body: bool, receive):
    """A receive that gives Django what was read before going on with the rest."""
    replayed = False

    async def replay():
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": more_body}

    return replay


def _is_json(headers: dict) -> bool:
    return headers.get(b"content-type", b"").split(b";")[0].strip() == b"application/json"


def _json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None
