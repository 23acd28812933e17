"""Background work through a real Celery worker and Redis broker."""

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from sandboxes.models import Sandbox, Session
from sandboxes.runtime import services
from tests import factories


def wait_for_state(sandbox_id, states, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sandbox = Sandbox.objects.get(pk=sandbox_id)
        if sandbox.state in states:
            return sandbox
        time.sleep(0.2)
    raise AssertionError(f"sandbox stayed {sandbox.state}")


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_requesting_a_sandbox_through_the_api_starts_it_in_the_worker(
    celery_worker, client_for, owner, egress_proxy, clean_runtimes
):
    response = client_for(owner).post(
        "/api/v1/sandbox/", {"network_policy": "restricted"}, format="json"
    )
    assert response.status_code == 202
    assert response.json()["network_policy"] == "restricted"
    sandbox = wait_for_state(response.json()["id"], {Sandbox.State.RUNNING, Sandbox.State.FAILED})
    assert sandbox.state == Sandbox.State.RUNNING, sandbox.failure_reason
    assert services.sandbox_exec(user=owner, argv=["true"]).exit_code == 0


@pytest.mark.django_db
def test_only_sandboxes_quiet_for_the_idle_time_with_no_agent_working_go_to_sleep(
    owner, colleague, django_capture_on_commit_callbacks
):
    long_ago = timezone.now() - timedelta(seconds=settings.QUOR_SANDBOX_IDLE_SECONDS + 5)
    stale = factories.make_sandbox(owner, state=Sandbox.State.RUNNING, last_activity_at=long_ago)
    fresh = factories.make_sandbox(
        colleague, state=Sandbox.State.RUNNING, last_activity_at=timezone.now()
    )
    with django_capture_on_commit_callbacks() as enqueued:
        assert services.sandboxes_sleep_idle() == [str(stale.pk)]
    assert len(enqueued) == 1  # the sleep task, once committed
    assert services.sandbox_is_idle(stale)
    assert not services.sandbox_is_idle(fresh)
    session = factories.make_session(owner, sandbox=stale)
    Session.objects.filter(pk=session.pk).update(status=Session.Status.RUNNING)
    assert not services.sandbox_is_idle(stale)  # an agent at work is not idleness


@pytest.mark.django_db
@pytest.mark.docker  # the backend asks the Docker Engine its API version when it is made
def test_an_unexpected_failure_while_starting_is_recorded_not_left_provisioning(owner, monkeypatch):
    from sandboxes.backends.docker import DockerBackend

    def broken(self, spec):
        raise KeyError("surprise")

    monkeypatch.setattr(DockerBackend, "ensure", broken)
    monkeypatch.setattr(DockerBackend, "egress_proxy_address", lambda self: "10.232.0.1")
    with pytest.raises(KeyError):
        services.sandbox_ensure(user=owner)
    sandbox = Sandbox.objects.get(user=owner)
    assert sandbox.state == Sandbox.State.FAILED
    assert "surprise" in sandbox.failure_reason
