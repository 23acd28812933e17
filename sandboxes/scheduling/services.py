"""Scheduled tasks: a prompt that Celery beat starts as a new session on a cron
schedule, evaluated in the task's time zone and stored in UTC.

Each due time gets exactly one ScheduledRun that records what became of it. A run
that started a session is `running` until that session's turn ends
(`settle_scheduled_run`, on `session_status_changed` in the transaction that changes the
session's status). While
a run is `running` the egress proxy treats its session as unattended (Ask actions of
the task's pre-approved Apps go through, other Ask actions fail at once)."""

import logging
import zoneinfo
from datetime import UTC, datetime
from functools import cache

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone as dj_timezone

from apps.selectors import apps_for_selection
from quor.lib.errors import Conflict, InvalidInput, NotFound, QuorError
from quor.lib.ids import is_database_id
from quor.lib.permissions import check_model_access, check_sandbox_access
from quor.selectors import make_model_id
from sandboxes.models import ScheduledRun, ScheduledTask, Session, Skill
from sandboxes.sessions import services as sessions

logger = logging.getLogger(__name__)

CRON_FIELDS = "minute hour day-of-month month day-of-week"
MAX_NAME_CHARS = 200
MAX_CRON_CHARS = 100
RUNS_SHOWN = 100
_UNSET = object()


# --- reads -------------------------------------------------------------------------------


def scheduled_tasks_of(user):
    return (
        ScheduledTask.objects.filter(owner=user)
        .select_related("model_provider")
        .prefetch_related("apps", "preapproved_apps")
    )


def get_scheduled_task_for_user(user, task_id) -> ScheduledTask:
    """The user's own scheduled task; anyone else's, or a malformed id, is 404."""
    task = None
    if is_database_id(task_id):
        task = scheduled_tasks_of(user).filter(pk=int(task_id)).first()
    if task is None:
        raise NotFound("No such scheduled task.")
    return task


def runs_of(task: ScheduledTask, limit: int = RUNS_SHOWN) -> list[ScheduledRun]:
    """The task's newest runs first."""
    return list(task.runs.select_related("session").order_by("-scheduled_for")[:limit])


def scheduled_tasks_with_latest_run(user):
    """The user's scheduled tasks, each with `latest_runs`: a list of its newest run
    (empty before the first)."""
    latest = ScheduledRun.objects.order_by("-scheduled_for")[:1]
    return scheduled_tasks_of(user).prefetch_related(
        Prefetch("runs", queryset=latest, to_attr="latest_runs")
    )


def all_runs_of(task: ScheduledTask):
    """Every run of the task (the API pages them)."""
    return task.runs.all()


def last_run_of(task: ScheduledTask) -> ScheduledRun | None:
    return task.runs.order_by("-scheduled_for").first()


@cache
def time_zone_names() -> tuple[str, ...]:
    """The IANA time zone names a task may use (from the tz database Python sees)."""
    return tuple(sorted(zoneinfo.available_timezones()))


# --- cron and time zones -----------------------------------------------------------------


def clean_cron(expression) -> str:
    """A five-field cron expression with single spaces, or InvalidInput saying what is wrong."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidInput(
            f"A schedule is a cron expression with five fields: {CRON_FIELDS}.",
            code="scheduled.invalid_cron",
        )
    fields = expression.split()
    expression = " ".join(fields)
    if len(fields) != 5:
        raise InvalidInput(
            f"{expression!r} has {len(fields)} field{'s' if len(fields) != 1 else ''}; a cron "
            f"expression has five: {CRON_FIELDS}.",
            code="scheduled.invalid_cron",
        )
    if len(expression) > MAX_CRON_CHARS:
        raise InvalidInput(
            f"The cron expression is longer than {MAX_CRON_CHARS} characters.",
            code="scheduled.invalid_cron",
        )
    try:
        next(CronSim(expression, datetime.now(UTC)))
    except CronSimError as exc:
        problem = str(exc).lower() if str(exc).startswith("Bad ") else str(exc)
        raise InvalidInput(
            f"{expression!r} is not a valid cron expression: {problem} field "
            f"(the fields are {CRON_FIELDS}).",
            code="scheduled.invalid_cron",
        ) from None
    except StopIteration:
        raise InvalidInput(
            f"{expression!r} never matches a date.", code="scheduled.invalid_cron"
        ) from None
    return expression


def clean_timezone(name) -> str:
    if not isinstance(name, str) or name not in time_zone_names():
        raise InvalidInput(
            f"{name!r} is not a known time zone; use an IANA name such as Europe/Paris or UTC.",
            code="scheduled.invalid_timezone",
        )
    return name


def next_run_after(cron: str, time_zone: str, after: datetime) -> datetime | None:
    """The first time strictly after `after` that the (valid) cron expression matches,
    read as wall-clock time in `time_zone`, in UTC. Times that a DST change skips run at
    the first minute after the gap; times it repeats run once (cronsim, as Debian cron)."""
    for candidate in CronSim(cron, after.astimezone(zoneinfo.ZoneInfo(time_zone))):
        if candidate > after:
            return candidate.astimezone(UTC)
    return None  # no match within 50 years


# --- writes by the owner -------------------------------------------------------------------


def _clean_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("A scheduled task needs a name.", code="scheduled.invalid_name")
    if len(name.strip()) > MAX_NAME_CHARS:
        raise InvalidInput(
            f"The name is longer than {MAX_NAME_CHARS} characters.", code="scheduled.invalid_name"
        )
    return name.strip()


def _clean_prompt(prompt) -> str:
    """As a session's prompt (it becomes one at every run)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInput("The prompt is empty.", code="sessions.empty_message")
    if len(prompt) > settings.QUOR_MAX_PROMPT_CHARS:
        raise InvalidInput(
            f"The prompt is longer than {settings.QUOR_MAX_PROMPT_CHARS} characters.",
            code="sessions.message_too_long",
        )
    return prompt


def _clean_skills(organization, skills) -> list[str]:
    if not isinstance(skills, list | tuple) or not all(isinstance(s, str) for s in skills):
        raise InvalidInput("Skills are given by their names.", code="sessions.unknown_skill")
    known = set(Skill.objects.filter(organization=organization).values_list("name", flat=True))
    unknown = set(skills) - known
    if unknown:
        raise InvalidInput(
            f"Unknown Skills: {', '.join(sorted(unknown))}.", code="sessions.unknown_skill"
        )
    return sorted(set(skills))


def _clean(user, organization, given: dict, task: ScheduledTask | None) -> dict:
    """Checks every given field (and the pre-approved Apps against the Apps the task
    will have) before anything is written: bad input changes nothing."""
    clean = {}
    if "name" in given:
        clean["name"] = _clean_name(given["name"])
    if "prompt" in given:
        clean["prompt"] = _clean_prompt(given["prompt"])
    if "cron" in given:
        clean["cron"] = clean_cron(given["cron"])
    if "timezone" in given:
        clean["timezone"] = clean_timezone(given["timezone"])
    if "model" in given:
        clean["model"] = check_model_access(user, given["model"])
    if "skills" in given:
        clean["skills"] = _clean_skills(organization, given["skills"])
    if "apps" in given:
        clean["apps"] = apps_for_selection(organization, given["apps"])
    if "preapproved_apps" in given:
        clean["preapproved_apps"] = apps_for_selection(organization, given["preapproved_apps"])
    if "enabled" in given:
        clean["enabled"] = bool(given["enabled"])
    if "apps" in clean or "preapproved_apps" in clean:
        selected = (
            {app.pk for app in clean["apps"]}
            if "apps" in clean
            else set(task.apps.values_list("pk", flat=True))
        )
        preapproved = (
            clean["preapproved_apps"]
            if "preapproved_apps" in clean
            else list(task.preapproved_apps.all())
        )
        outside = sorted(app.name for app in preapproved if app.pk not in selected)
        if outside:
            raise InvalidInput(
                f"Pre-approved Apps must also be selected for the task: {', '.join(outside)}.",
                code="scheduled.preapproved_not_selected",
            )
    return clean


def _save(task: ScheduledTask, clean: dict) -> None:
    for name in ("name", "prompt", "cron", "timezone", "skills", "enabled"):
        if name in clean:
            setattr(task, name, clean[name])
    if "model" in clean:
        task.model_provider, task.model_name = clean["model"].provider, clean["model"].name
    task.save()
    if "apps" in clean:
        task.apps.set(clean["apps"])
    if "preapproved_apps" in clean:
        task.preapproved_apps.set(clean["preapproved_apps"])


@transaction.atomic
def scheduled_task_create(
    *,
    user,
    name,
    prompt,
    cron,
    model: str,
    timezone="UTC",
    skills=(),
    apps=(),
    preapproved_apps=(),
    enabled=True,
) -> ScheduledTask:
    """A new scheduled task of the user; its first run is the next time the cron matches."""
    membership = check_sandbox_access(user)
    given = {
        "name": name,
        "prompt": prompt,
        "cron": cron,
        "timezone": timezone,
        "model": model,
        "skills": list(skills),
        "apps": list(apps),
        "preapproved_apps": list(preapproved_apps),
        "enabled": enabled,
    }
    clean = _clean(user, membership.organization, given, None)
    task = ScheduledTask(owner=user)
    if clean["enabled"]:
        task.next_run_at = next_run_after(clean["cron"], clean["timezone"], dj_timezone.now())
    _save(task, clean)
    return task


@transaction.atomic
def scheduled_task_update(
    *,
    user,
    task: ScheduledTask,
    name=_UNSET,
    prompt=_UNSET,
    cron=_UNSET,
    timezone=_UNSET,
    model=_UNSET,
    skills=_UNSET,
    apps=_UNSET,
    preapproved_apps=_UNSET,
    enabled=_UNSET,
) -> ScheduledTask:
    """Changes the given fields. A new schedule, time zone or re-enabling counts from now
    (times missed while disabled are not run); disabling clears the next run."""
    membership = check_sandbox_access(user)
    task = ScheduledTask.objects.select_for_update().filter(pk=task.pk, owner=user).first()
    if task is None:
        raise NotFound("No such scheduled task.")
    given = {
        key: value
        for key, value in {
            "name": name,
            "prompt": prompt,
            "cron": cron,
            "timezone": timezone,
            "model": model,
            "skills": skills,
            "apps": apps,
            "preapproved_apps": preapproved_apps,
            "enabled": enabled,
        }.items()
        if value is not _UNSET
    }
    clean = _clean(user, membership.organization, given, task)
    schedule = (clean.get("cron", task.cron), clean.get("timezone", task.timezone))
    if not clean.get("enabled", task.enabled):
        task.next_run_at = None
    elif not task.enabled or schedule != (task.cron, task.timezone) or not task.next_run_at:
        task.next_run_at = next_run_after(*schedule, dj_timezone.now())
    _save(task, clean)
    return task


@transaction.atomic
def scheduled_task_delete(*, user, task: ScheduledTask) -> None:
    """Deletes the task and its runs; the sessions it started stay (as ordinary ones)."""
    deleted, _ = ScheduledTask.objects.filter(pk=task.pk, owner=user).delete()
    if not deleted:
        raise NotFound("No such scheduled task.")


# --- runs ----------------------------------------------------------------------------------


def _local(task: ScheduledTask, moment: datetime) -> str:
    return f"{moment.astimezone(zoneinfo.ZoneInfo(task.timezone)):%Y-%m-%d %H:%M} {task.timezone}"


def _outcome(session: Session | None) -> tuple[str, str] | None:
    """(run status, reason) for a session whose turn has ended; None while it works."""
    if session is None:
        return ScheduledRun.Status.FAILED, "The run's session was deleted."
    if session.status in sessions.OPEN_STATUSES:
        return None
    if session.status in (Session.Status.WAITING, Session.Status.FINISHED):
        return ScheduledRun.Status.FINISHED, ""
    if session.status == Session.Status.CANCELLED:
        event = session.events.filter(kind="cancelled").order_by("-seq").first()
        by = event.payload.get("by") if event else None
        return ScheduledRun.Status.FAILED, f"Cancelled by {by}." if by else "Cancelled."
    event = session.events.filter(kind="error").order_by("-seq").first()
    payload = event.payload if event else {}
    message = payload.get("message") or "The agent stopped with an error."
    code = payload.get("code")
    return ScheduledRun.Status.FAILED, f"{message} ({code})" if code else message


def _settle(run: ScheduledRun, session: Session | None) -> bool:
    """Ends a running run as its session's turn ended (a conditional update: settling
    twice is harmless)."""
    outcome = _outcome(session)
    if outcome is None:
        return False
    status, reason = outcome
    reason = " ".join(part for part in (run.reason, reason) if part)
    return bool(
        ScheduledRun.objects.filter(pk=run.pk, status=ScheduledRun.Status.RUNNING).update(
            status=status, reason=reason, finished_at=dj_timezone.now()
        )
    )


def settle_scheduled_run(sender, *, session: Session, **kwargs) -> None:
    """`session_status_changed`: the scheduled run that started the session ends with
    its turn, `finished` on waiting, `failed` with the reason on failed or cancelled."""
    run = ScheduledRun.objects.filter(session_id=session.pk, status=ScheduledRun.Status.RUNNING)
    run = run.first()
    if run is not None:
        _settle(run, Session.objects.filter(pk=session.pk).first())


def _run_in_progress(task: ScheduledTask) -> ScheduledRun | None:
    """The task's run whose session still works. A running run whose session has ended
    by a path that did not report it (or was deleted) is settled here."""
    for run in task.runs.filter(status=ScheduledRun.Status.RUNNING).select_related("session"):
        if not _settle(run, run.session):
            return run
    return None


def _start_session(task: ScheduledTask) -> Session:
    return sessions.session_create(
        user=task.owner,
        prompt=task.prompt,
        model=make_model_id(task.model_provider_id, task.model_name),
        title=f"{task.name} (scheduled)",
        skills=task.skills,
        apps=list(task.apps.values_list("pk", flat=True)),
    )


def _start_run(task: ScheduledTask, scheduled_for: datetime) -> ScheduledRun:
    """Records the outcome of one due time: a session started (running), or why not."""

    def record(status, reason="", session=None):
        finished_at = None if status == ScheduledRun.Status.RUNNING else dj_timezone.now()
        return ScheduledRun.objects.create(
            task=task,
            scheduled_for=scheduled_for,
            status=status,
            reason=reason,
            session=session,
            finished_at=finished_at,
        )

    owner = task.owner
    if not owner.is_active:
        return record(ScheduledRun.Status.FAILED, "The owner's account is deactivated.")
    try:
        check_sandbox_access(owner)
    except QuorError as exc:
        return record(ScheduledRun.Status.FAILED, f"No Sandbox access: {exc.message}")
    previous = _run_in_progress(task)
    if previous is not None:
        return record(
            ScheduledRun.Status.SKIPPED,
            f"The run due {_local(task, previous.scheduled_for)} is still going.",
        )
    try:
        session = _start_session(task)
    except QuorError as exc:
        return record(ScheduledRun.Status.FAILED, f"The session could not start: {exc.message}")
    except Exception:
        logger.exception("scheduled task %s: the session could not start", task.pk)
        return record(
            ScheduledRun.Status.FAILED, "The session could not start (an unexpected error)."
        )
    return record(ScheduledRun.Status.RUNNING, session=session)


def _run_due_task(task_id: int, now: datetime) -> ScheduledRun | None:
    with transaction.atomic():
        task = (
            ScheduledTask.objects.select_for_update(skip_locked=True)
            .filter(pk=task_id, enabled=True, next_run_at__lte=now)
            .first()
        )
        if task is None:  # another worker has it, or it changed meanwhile
            return None
        due_at = task.next_run_at
        run = None
        if not task.runs.filter(scheduled_for=due_at).exists():
            run = _start_run(task, due_at)
        # Missed times are not replayed: the next run is the next time after now.
        task.next_run_at = next_run_after(task.cron, task.timezone, now)
        task.save(update_fields=["next_run_at"])
    return run


def run_due_scheduled_tasks(*, now: datetime | None = None) -> list[ScheduledRun]:
    """Runs every enabled task that is due, each in its own transaction, and advances
    its next run. Idempotent: a due time gets exactly one run, and a task another
    worker holds is left to it."""
    now = now or dj_timezone.now()
    due = list(
        ScheduledTask.objects.filter(enabled=True, next_run_at__lte=now)
        .order_by("next_run_at")
        .values_list("pk", flat=True)
    )
    runs = []
    for task_id in due:
        try:
            run = _run_due_task(task_id, now)
        except Exception:  # one broken task must not hold up the others
            logger.exception("scheduled task %s could not be run", task_id)
            continue
        if run is not None:
            runs.append(run)
    return runs


@transaction.atomic
def run_now(*, user, task: ScheduledTask) -> ScheduledRun:
    """Starts a run at once (the schedule is unchanged). Unlike a due time, a refusal is
    the owner's to see: nothing is recorded and the error is raised."""
    check_sandbox_access(user)
    task = ScheduledTask.objects.select_for_update().filter(pk=task.pk, owner=user).first()
    if task is None:
        raise NotFound("No such scheduled task.")
    previous = _run_in_progress(task)
    if previous is not None:
        raise Conflict(
            f"The run due {_local(task, previous.scheduled_for)} is still going.",
            code="scheduled.run_in_progress",
        )
    session = _start_session(task)
    return ScheduledRun.objects.create(
        task=task,
        scheduled_for=dj_timezone.now(),
        status=ScheduledRun.Status.RUNNING,
        session=session,
        reason=f"Started by hand by {user.email}.",
    )
