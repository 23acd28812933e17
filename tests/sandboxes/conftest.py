import pytest

from tests import factories


@pytest.fixture
def logged_in(client, owner):
    """A browser logged in as the owner."""
    client.force_login(owner)
    return client


def held_back(monkeypatch, task_name: str) -> list:
    """The arguments `task_name` was sent with, each send kept here instead of going to
    a worker; other tasks are sent as usual."""
    from quor.lib import tasks

    calls = []
    send = tasks.send

    def hold_back(name, *args):
        if name == task_name:
            calls.extend(args or [name])
        else:
            send(name, *args)

    monkeypatch.setattr(tasks, "send", hold_back)
    return calls


@pytest.fixture
def queued(monkeypatch):
    """The agent turns that would be enqueued (no worker runs in these tests)."""
    return held_back(monkeypatch, "sandboxes.tasks.run_agent_turn")


@pytest.fixture
def model_id(org):
    provider = factories.make_provider(org, model_names=["claude-test"])
    return f"{provider.pk}:claude-test"


@pytest.fixture
def task(owner, model_id):
    """The owner's daily scheduled task, at 09:00 in Paris."""
    from sandboxes.scheduling import services as scheduled

    return scheduled.scheduled_task_create(
        user=owner,
        name="Daily report",
        prompt="Summarise",
        cron="0 9 * * *",
        timezone="Europe/Paris",
        model=model_id,
    )
