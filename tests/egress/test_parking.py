"""The proxy's approval desk against the real test Redis and database: a parked
request waits for its decision listener rather than failing while it subscribes."""

import threading
import time

import pytest

from approvals.models import ApprovalRequest
from egress.parking import SUBSCRIBE_WAIT_SECONDS, UNAVAILABLE, ApprovalDesk
from sandboxes.models import Session
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def request_to_park(owner, org):
    app = factories.make_app(
        org, name="FakeHub", actions=[("issues.create", "POST", "/repos/{o}/{r}/issues", "ask")]
    )
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    session.apps.set([app])
    return {
        "session_id": session.pk,
        "app_id": app.pk,
        "app_name": app.name,
        "actions": [{"key": "issues.create", "name": "Create an issue", "policy": "ask"}],
        "method": "POST",
        "url": "https://apps.test/repos/o/r/issues",
        "summary": "FakeHub: Create an issue",
    }


@pytest.fixture
def desk():
    desk = ApprovalDesk()
    yield desk
    desk.stop()


def test_the_first_request_after_the_desk_starts_is_parked_not_refused(desk, request_to_park):
    desk.start()
    status = desk.park_and_wait(client_gone=lambda: True, **request_to_park)
    assert status == ApprovalRequest.Status.EXPIRED
    assert ApprovalRequest.objects.get().decided_via == "proxy"


def test_a_request_fails_closed_when_redis_stays_unreachable(desk, request_to_park, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    desk.start()
    started = time.monotonic()
    assert desk.park_and_wait(**request_to_park) == UNAVAILABLE
    assert time.monotonic() - started >= SUBSCRIBE_WAIT_SECONDS
    assert not ApprovalRequest.objects.exists()


def test_a_stopped_desk_leaves_no_thread_behind():
    desk = ApprovalDesk()
    desk.start()
    assert desk.listener.wait_until_subscribed(SUBSCRIBE_WAIT_SECONDS)
    desk.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("egress-approvals")]
