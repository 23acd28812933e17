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
from django.db import DatabaseError

from quor.lib import logs
from quor.lib.kept_connections import on_kept_connection
from sandboxes.sessions.events import session_events_publish
from sandboxes.sessions.services import session_progress_report

logger = logging.getLogger(__name__)
REPORT_PATH = re.compile(r"/api/v1/runtime/sessions/(?P<session>[^/]+)/events/")
_store = on_kept_connection(session_progress_report)
# A progress report is text deltas and tool events; a larger body (a long tool output)
# goes to the view, so that no request, authenticated or not, has this code buffer and
# parse much on the event loop.
PROGRESS_REPORT_MAX_BYTES = 256 * 1024


class RuntimeProgressReports:
    """ASGI: stores and publishes the progress reports it can, passes on the rest."""

    def __init__(self, django_app):
        self.django_app = django_app

    async def __call__(self, scope, receive, send):
        match = REPORT_PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
        credential = _single_bearer_credential(scope) if match else None
        if not credential or scope["method"] != "POST":
            return await self.django_app(scope, receive, send)
        started = time.monotonic()
        headers = dict(scope["headers"])
        limit = min(PROGRESS_REPORT_MAX_BYTES, settings.QUOR_MAX_REQUEST_BYTES)
        body, more_body = await _read_body(receive, limit)
        if body is None:
            return  # the client left
        sized = not more_body and len(body) <= limit and len(body) == _content_length(headers)
        report = _json(body) if sized and _is_json(headers) else None
        stored = None
        if report is not None:
            try:
                stored = await _store(
                    session_id=match["session"], credential=credential, report=report
                )
            except DatabaseError:  # refused by PostgreSQL, or out of reach: the view answers
                stored = None
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
            logs.log_access("POST", scope["path"], 200, started)
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


def _single_bearer_credential(scope) -> str | None:
    """The Bearer credential when the request has one Authorization header (Django joins
    repeated ones, which the view then refuses)."""
    values = [value for name, value in scope["headers"] if name.lower() == b"authorization"]
    if len(values) != 1:
        return None
    keyword, _, credential = values[0].decode("latin-1").partition(" ")
    return credential.strip() if keyword == "Bearer" else None


def _content_length(headers: dict) -> int | None:
    value = headers.get(b"content-length", b"")
    return int(value) if value.isascii() and value.isdigit() else None


def _is_json(headers: dict) -> bool:
    return headers.get(b"content-type", b"").split(b";")[0].strip() == b"application/json"


def _json(body: bytes):
    """As DRF's parser reads it: UTF-8, no NaN or Infinity; None for anything else."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")
