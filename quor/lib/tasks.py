"""Sending Celery tasks by name, so that a service never imports the tasks module that
calls it (the tasks import the services; tests/quor/test_task_names.py checks every
name sent is a registered task)."""

from django.db import transaction

from quor.celery import app


def send(task_name: str, *args: str) -> None:
    app.send_task(task_name, args=args)


def send_on_commit(task_name: str, *args: str) -> None:
    """Once the transaction commits (now, outside one); a broker that is down then is
    logged, not raised: the state is in PostgreSQL and a periodic task picks it up."""
    transaction.on_commit(lambda: send(task_name, *args), robust=True)
