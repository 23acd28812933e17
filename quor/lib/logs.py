"""Log lines as text for people at a terminal, or as JSON lines for a log pipeline
(QUOR_LOG_FORMAT), carrying the request id of the HTTP request or the id of the Celery
task they were written for; and the filter that keeps query values, credentials and
token-like strings out of both (settings.LOGGING puts it on the one handler)."""

import json
import logging
import re
import time
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime

# Set by quor.lib.middleware.RequestIdMiddleware for an HTTP request, by quor.celery's
# signal receivers for a task.
request_id: ContextVar[str] = ContextVar("quor_request_id", default="")
task_id: ContextVar[str] = ContextVar("quor_task_id", default="")
# Who the request is from, once an entry point authenticated them (the audit log's actor).
actor: ContextVar = ContextVar("quor_actor", default=None)


def acting_as(user) -> None:
    actor.set(user if user is not None and user.is_authenticated else None)


# An X-Request-ID worth keeping: a short plain token (a load balancer's id, a UUID).
SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def request_id_from(header: str | None) -> str:
    """The caller's X-Request-ID if it is a safe token, else a new one."""
    if header and SAFE_REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


_access_logger = logging.getLogger("quor.access")


def log_access(method: str, path: str, status: int, started: float) -> None:
    """The access line of a request (path without its query), in its request id's
    context; `started` is its time.monotonic() at arrival."""
    elapsed = (time.monotonic() - started) * 1000
    _access_logger.info("%s %s %s %.0fms", method, path, status, elapsed)


MASK = "***"
# Each pattern with what replaces it; group 1 (and 2, 3) is kept, the rest masked.
REDACTIONS = [
    # A private key, whole.
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
        ),
        "[private key]",
    ),
    # Credentials in a URL: scheme://user:password@host (the proxy URL sandboxes get).
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), rf"\1{MASK}@"),
    # Every query value: ?name=value&name=value.
    (re.compile(r"([?&][^=&\s#?\"'<>]+=)[^&\s#\"'<>]*"), rf"\1{MASK}"),
    # Cookie headers: every cookie, to the end of the value.
    (re.compile(r"(?i)((?:set-)?cookie[\"']?\s*[:=]\s*[\"']?)[^\"'\n]*"), rf"\1{MASK}"),
    # A credential field's value, with its scheme: Authorization: Bearer ..., token=...,
    # 'HTTP_AUTHORIZATION': '...', "api_key": "...", QUOR_SECRET_KEY=... ("tokens" is no
    # field of this kind: model errors name max_tokens).
    (
        re.compile(
            r"(?i)([\w-]*(?:authorization|api[_-]?key|token|secret|passw(?:or)?d|credentials?)"
            r"(?:[_-][\w-]*)?)([\"']?\s*[:=]\s*[\"']?)"
            r"((?:bearer|basic|token|digest)\s+)?[^\s\"',;&}\]]+"
        ),
        rf"\1\2\3{MASK}",
    ),
    # Token shapes wherever they are: Quor's API tokens, provider and forge keys, JWTs.
    (
        re.compile(
            r"\b(quor_pat_[\w-]+|sk-[\w-]{16,}|sk-ant-[\w-]+|gh[pousr]_[A-Za-z0-9]{20,}"
            r"|github_pat_\w+|xox[abpr]-[\w-]+|AKIA[0-9A-Z]{16}|eyJ[\w-]{10,}\.eyJ[\w-]*\.[\w-]*)"
        ),
        MASK,
    ),
]


def redact(text: str) -> str:
    for pattern, replacement in REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


class RedactSecrets(logging.Filter):
    """Masks query values, credentials and token-like strings in a record's message and
    traceback, whatever logger wrote it (Quor's, Django's, Celery's, a library's)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it when it formats
            return True
        record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC), level, logger, message, and request_id or
    task_id when the line was written for one; exception when there was one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        # Django logs a request's response after the middleware is done: from the request.
        request = getattr(record, "request", None)
        if current := request_id.get() or getattr(request, "request_id", ""):
            entry["request_id"] = current
        if current := task_id.get():
            entry["task_id"] = current
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)
