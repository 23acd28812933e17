"""Celery tasks of agent turns: thin, idempotent, by id. Their names are those they had
when they lived in sandboxes/tasks.py, so queued messages and beat entries keep working."""

from celery import shared_task

from sandboxes.sessions.services import (
    session_run_turn,
    sessions_end_for_deactivated_user,
    sessions_fail_lost_turns,
    sessions_requeue_pending,
)


@shared_task(name="sandboxes.tasks.run_agent_turn")
def run_agent_turn(session_id: str) -> None:
    session_run_turn(session_id=session_id)


@shared_task(name="sandboxes.tasks.requeue_pending_turns")
def requeue_pending_turns() -> None:
    sessions_requeue_pending()


@shared_task(name="sandboxes.tasks.fail_lost_turns")
def fail_lost_turns() -> None:
    sessions_fail_lost_turns()


@shared_task(
    name="sandboxes.tasks.end_deactivated_users_work",
    acks_late=True,
    autoretry_for=(Exception,),
    retry_backoff=5,
    max_retries=8,
)
def end_deactivated_users_work(user_id: str) -> None:
    """Retried (a failed snapshot, a backend that is down): a deactivated user's sandbox
    must not stay running; each attempt starts over from what PostgreSQL says."""
    sessions_end_for_deactivated_user(user_id=user_id)
