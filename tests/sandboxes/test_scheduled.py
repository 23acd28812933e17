"""Scheduled tasks: validation, the schedule across DST, due runs and their outcomes."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_celery_beat.schedulers import ModelEntry

from apps.models import App
from quor.lib.errors import Conflict, InvalidInput, QuorError
from quor.models import Membership, Organization
from sandboxes.models import ScheduledRun, ScheduledTask, Session, Skill
from sandboxes.scheduling import services as scheduled
from sandboxes.scheduling import tasks
from sandboxes.sessions import services as sessions
from tests import factories


@pytest.fixture
def github(org):
    return App.objects.create(organization=org, name="GitHub", url_patterns=["https://github.test"])


@pytest.fixture
def slack(org):
    return App.objects.create(organization=org, name="Slack", url_patterns=["https://slack.test"])


@pytest.fixture
def make_task(owner, model_id):
    def make(**fields):
        fields = {"name": "Daily report", "prompt": "Summarise", "cron": "0 9 * * *", **fields}
        return scheduled.scheduled_task_create(user=owner, model=model_id, **fields)

    return make


def make_due(task, when=None):
    """Makes the task due (as if its next run time had come)."""
    when = when or timezone.now() - timedelta(minutes=1)
    ScheduledTask.objects.filter(pk=task.pk).update(next_run_at=when)
    task.refresh_from_db()
    return when


def start_turn(session):
    """What session_run_turn does first: the pending session starts running."""
    Session.objects.filter(pk=session.pk).update(status=Session.Status.RUNNING)
    session.refresh_from_db()


# --- validation ---------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("61 * * * *", "bad minute field"),
        ("0 25 * * *", "bad hour field"),
        ("0 9 * * MON-XYZ", "bad day-of-week field"),
        ("* * * *", "has 4 fields"),
        ("0 0 9 * * *", "has 6 fields"),
        ("", "five fields"),
        ("0 0 31 2 *", "bad day-of-month field"),
    ],
)
def test_an_invalid_cron_is_refused_saying_what_is_wrong_and_nothing_is_stored(
    make_task, cron, problem
):
    with pytest.raises(InvalidInput) as refused:
        make_task(cron=cron)
    assert refused.value.code == "scheduled.invalid_cron"
    assert problem in refused.value.message
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "", "../../etc/passwd", "europe/paris"])
def test_an_unknown_time_zone_is_refused_and_nothing_is_stored(make_task, name):
    with pytest.raises(InvalidInput) as refused:
        make_task(timezone=name)
    assert refused.value.code == "scheduled.invalid_timezone"
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_a_preapproved_app_that_is_not_selected_is_refused_and_nothing_is_stored(
    make_task, github, slack
):
    with pytest.raises(InvalidInput) as refused:
        make_task(apps=[github.pk], preapproved_apps=[slack.pk])
    assert refused.value.code == "scheduled.preapproved_not_selected"
    assert "Slack" in refused.value.message
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_an_update_that_unselects_a_preapproved_app_is_refused_and_changes_nothing(
    owner, make_task, github, slack
):
    task = make_task(apps=[github.pk, slack.pk], preapproved_apps=[slack.pk])
    with pytest.raises(InvalidInput) as refused:
        scheduled.scheduled_task_update(user=owner, task=task, apps=[github.pk], name="Renamed")
    assert refused.value.code == "scheduled.preapproved_not_selected"
    task.refresh_from_db()
    assert task.name == "Daily report"
    assert set(task.apps.all()) == {github, slack}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"model": "999:nope"}, "models.unknown_model"),
        ({"skills": ["no-such-skill"]}, "sessions.unknown_skill"),
        ({"apps": [999999]}, "apps.unknown_app"),
        ({"name": "  "}, "scheduled.invalid_name"),
        ({"prompt": " "}, "sessions.empty_message"),
    ],
)
def test_other_bad_input_is_refused_and_nothing_is_stored(owner, model_id, fields, code):
    values = {"name": "Report", "prompt": "Summarise", "cron": "0 9 * * *", "model": model_id}
    with pytest.raises(QuorError) as refused:
        scheduled.scheduled_task_create(user=owner, **{**values, **fields})
    assert refused.value.code == code
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_a_model_not_shared_with_the_owner_is_refused(owner, org):
    provider = factories.make_provider(org, available_to_everyone=False, model_names=["secret"])
    with pytest.raises(QuorError) as refused:
        scheduled.scheduled_task_create(
            user=owner, name="x", prompt="y", cron="0 9 * * *", model=f"{provider.pk}:secret"
        )
    assert refused.value.code == "access.model_not_allowed"
    assert not ScheduledTask.objects.exists()


@pytest.mark.django_db
def test_a_member_without_sandbox_access_cannot_create_a_task(owner, model_id):
    Membership.objects.filter(user=owner).update(can_use_sandbox=False)
    with pytest.raises(QuorError) as refused:
        scheduled.scheduled_task_create(
            user=owner, name="x", prompt="y", cron="0 9 * * *", model=model_id
        )
    assert refused.value.code == "access.sandbox_not_allowed"


@pytest.mark.django_db
def test_a_new_task_stores_everything_and_its_next_run_in_utc(make_task, github, slack, org):
    Skill.objects.create(organization=org, name="report", description="Reports")
    task = make_task(
        cron=" 0  9 * * 1-5 ",
        timezone="Europe/Paris",
        skills=["report"],
        apps=[github.pk, slack.pk],
        preapproved_apps=[github.pk],
    )
    task.refresh_from_db()
    assert task.cron == "0 9 * * 1-5"
    assert task.skills == ["report"]
    assert set(task.apps.all()) == {github, slack}
    assert list(task.preapproved_apps.all()) == [github]
    assert task.next_run_at.utcoffset() == timedelta(0)
    local = task.next_run_at.astimezone(scheduled.zoneinfo.ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)
    assert task.next_run_at > timezone.now()


# --- the schedule ------------------------------------------------------------------------


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def test_a_daily_time_in_paris_keeps_its_wall_clock_time_across_the_spring_dst_change():
    # 2026-03-29: Paris goes from CET (UTC+1) to CEST (UTC+2) at 02:00.
    first = scheduled.next_run_after("0 9 * * *", "Europe/Paris", utc(2026, 3, 27, 12))
    second = scheduled.next_run_after("0 9 * * *", "Europe/Paris", first)
    third = scheduled.next_run_after("0 9 * * *", "Europe/Paris", second)
    assert (first, second, third) == (utc(2026, 3, 28, 8), utc(2026, 3, 29, 7), utc(2026, 3, 30, 7))


def test_a_time_the_spring_dst_change_skips_runs_right_after_the_gap():
    # 02:30 does not exist in Paris on 2026-03-29: it runs at 03:00 CEST (01:00 UTC).
    first = scheduled.next_run_after("30 2 * * *", "Europe/Paris", utc(2026, 3, 28, 12))
    second = scheduled.next_run_after("30 2 * * *", "Europe/Paris", first)
    assert (first, second) == (utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30))


def test_a_time_the_autumn_dst_change_repeats_runs_once():
    # 02:30 happens twice in Paris on 2026-10-25 (CEST then CET): one run, the first.
    first = scheduled.next_run_after("30 2 * * *", "Europe/Paris", utc(2026, 10, 24, 12))
    second = scheduled.next_run_after("30 2 * * *", "Europe/Paris", first)
    assert (first, second) == (utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30))


def test_the_next_run_is_strictly_after_the_given_time():
    at_nine = utc(2026, 6, 1, 9)
    assert scheduled.next_run_after("0 9 * * *", "UTC", at_nine) == utc(2026, 6, 2, 9)
    assert scheduled.next_run_after("0 9 * * *", "UTC", at_nine - timedelta(seconds=1)) == at_nine


@pytest.mark.django_db
def test_disabling_clears_the_next_run_and_enabling_counts_from_now(owner, make_task):
    task = make_task(cron="*/5 * * * *")
    task = scheduled.scheduled_task_update(user=owner, task=task, enabled=False)
    assert (task.enabled, task.next_run_at) == (False, None)
    task = scheduled.scheduled_task_update(user=owner, task=task, enabled=True)
    assert timezone.now() < task.next_run_at <= timezone.now() + timedelta(minutes=5)
    task = scheduled.scheduled_task_update(user=owner, task=task, cron="0 3 * * *")
    assert (task.next_run_at.hour, task.next_run_at.minute) == (3, 0)


# --- due runs ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_due_task_starts_one_session_and_records_one_run(owner, make_task, github, queued):
    task = make_task(apps=[github.pk], preapproved_apps=[github.pk])
    due = make_due(task)
    now = timezone.now()
    [run] = scheduled.run_due_scheduled_tasks(now=now)
    assert (run.status, run.scheduled_for, run.reason) == ("running", due, "")
    session = run.session
    assert session.owner == owner
    assert session.title == "Daily report (scheduled)"
    assert session.model_name == "claude-test"
    assert list(session.apps.all()) == [github]
    assert session.events.get().payload["text"] == "Summarise"
    assert session.scheduled_run == run
    task.refresh_from_db()
    assert task.next_run_at == scheduled.next_run_after("0 9 * * *", "UTC", now)


@pytest.mark.django_db
def test_running_the_due_tasks_twice_creates_nothing_new(make_task, queued):
    task = make_task()
    make_due(task)
    now = timezone.now()
    assert len(scheduled.run_due_scheduled_tasks(now=now)) == 1
    assert scheduled.run_due_scheduled_tasks(now=now) == []
    assert (ScheduledRun.objects.count(), Session.objects.count()) == (1, 1)


@pytest.mark.django_db
def test_a_due_time_that_already_has_a_run_gets_no_second_one(make_task, queued):
    task = make_task()
    due = make_due(task)
    scheduled.run_due_scheduled_tasks()
    make_due(task, due)  # e.g. a stale copy of the task wrote the old time back
    assert scheduled.run_due_scheduled_tasks() == []
    assert (ScheduledRun.objects.count(), Session.objects.count()) == (1, 1)
    task.refresh_from_db()
    assert task.next_run_at > timezone.now()


@pytest.mark.django_db
def test_missed_times_are_not_replayed(make_task, queued):
    task = make_task(cron="0 * * * *")
    make_due(task, timezone.now() - timedelta(days=3))
    now = timezone.now()
    assert len(scheduled.run_due_scheduled_tasks(now=now)) == 1
    task.refresh_from_db()
    assert now < task.next_run_at <= now + timedelta(hours=1)


@pytest.mark.django_db
def test_disabled_and_not_yet_due_tasks_do_not_run(owner, make_task, queued):
    later = make_task(name="later")
    assert later.next_run_at > timezone.now()
    disabled = make_task(name="disabled")
    make_due(disabled)
    ScheduledTask.objects.filter(pk=disabled.pk).update(enabled=False)
    assert scheduled.run_due_scheduled_tasks() == []


@pytest.mark.django_db
def test_a_run_is_skipped_while_the_previous_runs_session_is_still_going(make_task, queued):
    task = make_task()
    make_due(task)
    [first] = scheduled.run_due_scheduled_tasks()
    start_turn(first.session)
    make_due(task)
    [second] = scheduled.run_due_scheduled_tasks()
    assert second.status == "skipped"
    assert "is still going" in second.reason
    assert second.session is None and second.finished_at is not None
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_a_previous_run_whose_session_ended_unnoticed_is_settled_and_the_next_one_starts(
    make_task, queued
):
    task = make_task()
    make_due(task)
    [first] = scheduled.run_due_scheduled_tasks()
    Session.objects.filter(pk=first.session_id).update(status=Session.Status.WAITING)
    make_due(task)
    [second] = scheduled.run_due_scheduled_tasks()
    first.refresh_from_db()
    assert (first.status, second.status) == ("finished", "running")
    assert Session.objects.count() == 2


def _lose_access(owner, how):
    membership = Membership.objects.get(user=owner)
    if how == "organization disabled":
        Organization.objects.filter(pk=membership.organization_id).update(is_active=False)
    elif how == "sandbox disabled for the organization":
        Organization.objects.filter(pk=membership.organization_id).update(sandbox_enabled=False)
    elif how == "member may not use sandbox":
        Membership.objects.filter(pk=membership.pk).update(can_use_sandbox=False)
    else:
        type(owner).objects.filter(pk=owner.pk).update(is_active=False)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("organization disabled", "Your organization is disabled."),
        ("sandbox disabled for the organization", "Sandbox is not enabled"),
        ("member may not use sandbox", "You are not allowed to use Sandbox."),
        ("user deactivated", "The owner's account is deactivated."),
    ],
)
def test_a_run_fails_with_the_reason_when_the_owner_lost_sandbox_access(
    owner, make_task, queued, how, reason
):
    task = make_task()
    make_due(task)
    _lose_access(owner, how)
    [run] = scheduled.run_due_scheduled_tasks()
    assert run.status == "failed"
    assert reason in run.reason
    assert run.finished_at is not None
    assert not Session.objects.exists()
    task.refresh_from_db()
    assert task.next_run_at > timezone.now()


@pytest.mark.django_db
def test_a_run_fails_with_the_error_when_the_session_cannot_start(make_task, queued):
    task = make_task()
    make_due(task)
    provider = task.model_provider
    provider.model_names = ["another-model"]
    provider.save()
    [run] = scheduled.run_due_scheduled_tasks()
    assert run.status == "failed"
    assert "Unknown model" in run.reason
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_the_beat_task_runs_the_due_tasks(make_task, queued, settings):
    task = make_task()
    make_due(task)
    tasks.run_scheduled_tasks()
    tasks.run_scheduled_tasks()
    assert ScheduledRun.objects.filter(task=task).count() == 1
    entry = settings.CELERY_BEAT_SCHEDULE["run-scheduled-tasks"]
    assert (entry["task"], entry["schedule"]) == ("sandboxes.tasks.run_scheduled_tasks", 30.0)
    options = ModelEntry._unpack_options(**entry["options"])  # as the database scheduler reads it
    assert (options["queue"], options["expire_seconds"]) == ("default", 25)


@pytest.mark.django_db(transaction=True)
def test_a_task_that_another_worker_holds_is_left_to_it(make_task, queued):
    task = make_task()
    make_due(task)
    locked, release = threading.Event(), threading.Event()

    def other_worker():
        with transaction.atomic():
            ScheduledTask.objects.select_for_update().get(pk=task.pk)
            locked.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        assert locked.wait(10)
        assert scheduled.run_due_scheduled_tasks() == []
    finally:
        release.set()
        thread.join()
    assert len(scheduled.run_due_scheduled_tasks()) == 1


# --- the run follows its session's turn -------------------------------------------------


@pytest.fixture
def running_run(make_task, queued):
    task = make_task()
    make_due(task)
    [run] = scheduled.run_due_scheduled_tasks()
    start_turn(run.session)
    return run


@pytest.mark.django_db
def test_the_run_finishes_when_the_sessions_turn_ends_waiting(running_run):
    sessions.session_events_report(
        session=running_run.session, events=[{"kind": "turn_finished", "payload": {}}]
    )
    running_run.refresh_from_db()
    assert (running_run.status, running_run.reason) == ("finished", "")
    assert running_run.finished_at is not None


@pytest.mark.django_db
def test_the_run_fails_with_the_reason_when_the_agent_reports_an_error(running_run):
    error = {"code": "model.timeout", "message": "The model did not answer in time."}
    sessions.session_events_report(
        session=running_run.session, events=[{"kind": "error", "payload": error}]
    )
    running_run.refresh_from_db()
    assert running_run.status == "failed"
    assert running_run.reason == "The model did not answer in time. (model.timeout)"


@pytest.mark.django_db
def test_the_run_fails_when_the_turn_ends_in_a_failure_of_the_sandbox(running_run):
    session = running_run.session
    started = factories.make_event(session, 2, kind="session_started")
    sessions._fail(session, started.seq, "agent.crashed", "The agent stopped unexpectedly: boom")
    running_run.refresh_from_db()
    assert running_run.status == "failed"
    assert "The agent stopped unexpectedly: boom" in running_run.reason


@pytest.mark.django_db
def test_the_run_fails_when_the_session_is_cancelled(owner, running_run):
    sessions.session_cancel(user=owner, session=running_run.session)
    running_run.refresh_from_db()
    assert (running_run.status, running_run.reason) == ("failed", "Cancelled by owner@acme.test.")


@pytest.mark.django_db
def test_events_that_do_not_end_the_turn_leave_the_run_running(running_run):
    sessions.session_events_report(
        session=running_run.session, events=[{"kind": "assistant_text", "payload": {"text": "…"}}]
    )
    running_run.refresh_from_db()
    assert running_run.status == "running"


@pytest.mark.django_db
def test_a_follow_up_after_the_run_leaves_the_run_as_it_ended(owner, running_run, queued):
    session = running_run.session
    sessions.session_events_report(session=session, events=[{"kind": "turn_finished"}])
    sessions.session_message(user=owner, session=session, text="And now?")
    start_turn(session)
    sessions.session_events_report(session=session, events=[{"kind": "error", "payload": {}}])
    running_run.refresh_from_db()
    assert running_run.status == "finished"


# --- run now -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_run_now_starts_a_run_and_refuses_a_second_while_it_goes(owner, make_task, queued):
    task = make_task()
    next_run_at = task.next_run_at
    run = scheduled.run_now(user=owner, task=task)
    assert run.status == "running"
    assert run.session.title == "Daily report (scheduled)"
    assert "by hand" in run.reason
    with pytest.raises(Conflict) as refused:
        scheduled.run_now(user=owner, task=task)
    assert refused.value.code == "scheduled.run_in_progress"
    task.refresh_from_db()
    assert task.next_run_at == next_run_at
    assert (ScheduledRun.objects.count(), Session.objects.count()) == (1, 1)


@pytest.mark.django_db
def test_nobody_else_can_run_update_or_delete_a_task(owner, colleague, make_task, queued):
    task = make_task()
    for action in (
        lambda: scheduled.run_now(user=colleague, task=task),
        lambda: scheduled.scheduled_task_update(user=colleague, task=task, name="mine"),
        lambda: scheduled.scheduled_task_delete(user=colleague, task=task),
    ):
        with pytest.raises(QuorError) as refused:
            action()
        assert refused.value.status == 404
    task.refresh_from_db()
    assert task.name == "Daily report"
    assert not ScheduledRun.objects.exists()


@pytest.mark.django_db
def test_deleting_a_task_keeps_the_sessions_it_started(owner, make_task, queued):
    task = make_task()
    run = scheduled.run_now(user=owner, task=task)
    scheduled.scheduled_task_delete(user=owner, task=task)
    assert not ScheduledTask.objects.exists()
    assert not ScheduledRun.objects.exists()
    assert Session.objects.filter(pk=run.session_id).exists()
