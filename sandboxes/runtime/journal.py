"""The exec journal: every command run through the API, a manage command or the
terminal is a row in PostgreSQL before it starts, and its result is written there.

A caller may send an idempotency key (the `Idempotency-Key` header): a retry with the
same key and the same request gets the first run's result back, and never a second run
(a different request with a used key is refused). A run whose process died says so:
each process that runs commands keeps a short-lived key in Redis while it lives, and
`execs_mark_interrupted` (beat, every minute) marks the runs of a process whose key
expired, or that passed their deadline, as interrupted."""

import hashlib
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from quor.lib.errors import Conflict, QuorError
from quor.lib.throttling import redis_client
from sandboxes.backends.base import ExecResult
from sandboxes.backends.execution import KILL_AFTER_S, SILENCE_GRACE_S
from sandboxes.models import ExecRecord

logger = logging.getLogger(__name__)

# An idempotency key: 1 to 255 visible ASCII characters (a UUID is the usual choice).
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# A runner's key lives this long unless its process renews it, every RUNNER_BEAT_S.
RUNNER_TTL_S = 30
RUNNER_BEAT_S = 10
RUNNER_KEY = "quor:exec-runner:{}"
# How long a command may wait for its sandbox to start (or wake) before it runs: part of
# the deadline, which only matters when Redis lost the runner's key.
START_BUDGET_S = 600


class ExecStillRunning(Conflict):
    code = "exec.in_progress"
    retry_after = 1


def clean_idempotency_key(value) -> str:
    """The key as sent, "" for none (None); a 400 for a malformed one, empty included."""
    if value is None:
        return ""
    if not isinstance(value, str) or not IDEMPOTENCY_KEY.fullmatch(value):
        raise QuorError(
            "Idempotency-Key must be 1 to 255 visible ASCII characters (a UUID, say).",
            code="exec.invalid_idempotency_key",
        )
    return value


def request_hash(session, request) -> str:
    """What makes two requests the same request: where, what, with what, how long."""
    canonical = json.dumps(
        {
            "session": str(session.pk) if session else None,
            "argv": request.argv,
            "cwd": request.cwd,
            "env": request.env,
            "timeout_s": float(request.timeout_s),
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def exec_begin(*, user, organization, session, request, idempotency_key: str, via) -> ExecRecord:
    """The journal row of a run about to start, or, for a key used before, the earlier
    run's finished record (`replayed`), a 409 while it runs or when it was interrupted,
    and a 422 for a key sent with another request. A run that never started (its
    sandbox was unavailable) is started again by its retry."""
    now = timezone.now()
    record = ExecRecord(
        organization=organization,
        user=user,
        session=session,
        via=via,
        idempotency_key=idempotency_key,
        request_hash=request_hash(session, request),
        argv=request.argv,
        cwd=request.cwd,
        env_names=sorted(request.env),
        timeout_s=request.timeout_s,
        runner=runner_name(),
        started_at=now,
        deadline=now + _runs_at_most(request.timeout_s),
    )
    if not idempotency_key:
        record.save(force_insert=True)
        return record
    try:
        with transaction.atomic():
            record.save(force_insert=True)
        return record
    except IntegrityError:
        pass  # the key was used before
    earlier = ExecRecord.objects.get(user=user, idempotency_key=idempotency_key)
    if earlier.request_hash != record.request_hash:
        raise QuorError(
            "This Idempotency-Key was used for another request; use a new key.",
            code="exec.idempotency_key_reused",
            status=422,
        )
    if earlier.status == ExecRecord.Status.NOT_STARTED and _claim_again(earlier, record):
        return earlier
    return _earlier_outcome(earlier.pk)


def exec_shell_command_begin(*, attachment: ExecRecord, argv: list[str], cwd: str) -> ExecRecord:
    """The record of a command the terminal's shell reported starting, in the attachment
    whose PTY reported it: its argv is the command line as the shell reported it (the
    shell's word, not Quor's), its deadline the attachment's."""
    now = timezone.now()
    record = ExecRecord(
        organization_id=attachment.organization_id,
        user_id=attachment.user_id,
        session_id=attachment.session_id,
        via=ExecRecord.Via.SHELL,
        attachment=attachment,
        request_hash="",
        argv=argv,
        cwd=cwd,
        timeout_s=0,
        runner=runner_name(),
        started_at=now,
        deadline=attachment.deadline,
    )
    record.save(force_insert=True)
    return record


def _claim_again(earlier: ExecRecord, record: ExecRecord) -> bool:
    fields = {
        "status": ExecRecord.Status.RUNNING,
        "runner": record.runner,
        "started_at": record.started_at,
        "deadline": record.deadline,
        "error": "",
        "finished_at": None,
    }
    claimed = ExecRecord.objects.filter(pk=earlier.pk, status=ExecRecord.Status.NOT_STARTED).update(
        **fields
    )
    for name, value in fields.items():
        setattr(earlier, name, value)
    return bool(claimed)


def _earlier_outcome(record_id) -> ExecRecord:
    earlier = ExecRecord.objects.get(pk=record_id)
    if earlier.status == ExecRecord.Status.FINISHED:
        earlier.replayed = True
        return earlier
    started = f"{earlier.started_at:%Y-%m-%d %H:%M:%S} UTC"
    if earlier.status == ExecRecord.Status.INTERRUPTED:
        raise Conflict(
            f"The command sent with this Idempotency-Key at {started} was interrupted "
            f"({earlier.error}); whether it ran to the end is unknown. Look at the "
            "workspace, then send it with a new key.",
            code="exec.interrupted",
        )
    raise ExecStillRunning(
        f"The command sent with this Idempotency-Key at {started} is still running; "
        "retry to get its result."
    )


def _runs_at_most(timeout_s: float) -> timedelta:
    return timedelta(seconds=START_BUDGET_S + timeout_s + KILL_AFTER_S + SILENCE_GRACE_S)


def exec_finished(record: ExecRecord, result: ExecResult) -> ExecRecord:
    """Writes the result, also over an `interrupted` written while Redis had lost the
    runner's key: the process that ran it knows best."""
    fields = {
        "status": ExecRecord.Status.FINISHED,
        "error": "",
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "stdout": bytes(result.stdout),
        "stderr": bytes(result.stderr),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "duration_s": result.duration_s,
        "finished_at": timezone.now(),
    }
    return _write(record, fields)


def exec_not_started(record: ExecRecord, reason: str) -> ExecRecord:
    return _ended_without_result(record, ExecRecord.Status.NOT_STARTED, reason)


def exec_interrupted(record: ExecRecord, reason: str) -> ExecRecord:
    return _ended_without_result(record, ExecRecord.Status.INTERRUPTED, reason)


def _ended_without_result(record: ExecRecord, status: str, reason: str) -> ExecRecord:
    return _write(record, {"status": status, "error": reason, "finished_at": timezone.now()})


def _write(record: ExecRecord, fields: dict) -> ExecRecord:
    ExecRecord.objects.filter(pk=record.pk, runner=record.runner).update(**fields)
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def execs_mark_interrupted(now=None) -> int:
    """Marks the running records whose process is gone or that passed their deadline;
    returns how many. A process is gone when its runner key expired in Redis or, on
    this host, when its pid is no longer alive."""
    now = now or timezone.now()
    running = ExecRecord.objects.filter(status=ExecRecord.Status.RUNNING)
    runners = sorted(set(running.values_list("runner", flat=True)))
    gone = [runner for runner in runners if _died_on_this_host(runner)]
    if runners:
        pipe = redis_client().pipeline(transaction=False)
        for runner in runners:
            pipe.exists(RUNNER_KEY.format(runner))
        try:
            gone += [
                runner for runner, lives in zip(runners, pipe.execute(), strict=True) if not lives
            ]
        except redis.RedisError as exc:
            logger.warning("runner keys unreadable, deadlines only: %s", exc)
    return running.filter(Q(deadline__lt=now) | Q(runner__in=gone)).update(
        status=ExecRecord.Status.INTERRUPTED,
        error="the process running it stopped before it finished",
        finished_at=now,
    )


def _died_on_this_host(runner: str) -> bool:
    host, _, pid = runner.rpartition(":")[0].rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def exec_records_delete_old() -> int:
    """Records older than QUOR_EXEC_JOURNAL_RETENTION_DAYS, and with them their keys."""
    cutoff = timezone.now() - timedelta(days=settings.QUOR_EXEC_JOURNAL_RETENTION_DAYS)
    deleted, _ = ExecRecord.objects.filter(started_at__lt=cutoff).delete()
    return deleted


# --- the runner: this process, while it lives ------------------------------------------

_runner_lock = threading.Lock()
_runner: dict = {"pid": None, "name": ""}


def runner_name() -> str:
    """This process's name in the journal (host, pid, a token: pids are reused), with
    its key in Redis set now and renewed by a thread. A forked child gets its own."""
    with _runner_lock:
        if _runner["pid"] != os.getpid():
            name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
            _runner.update(pid=os.getpid(), name=name)
            _renew_runner_key(name)
            threading.Thread(
                target=_keep_runner_key, args=(name,), name="exec-runner-key", daemon=True
            ).start()
        return _runner["name"]


def _renew_runner_key(name: str) -> None:
    try:
        redis_client().set(RUNNER_KEY.format(name), "1", ex=RUNNER_TTL_S)
    except redis.RedisError as exc:
        logger.warning("the exec runner key was not renewed: %s", exc)


def _keep_runner_key(name: str) -> None:
    while _runner["name"] == name:
        time.sleep(RUNNER_BEAT_S)
        _renew_runner_key(name)
