"""The proxy's approval desk against the real test Redis and database: a parked
request waits for its decision listener rather than failing while it subscribes."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from approvals import services
from approvals.models import ApprovalRequest, SessionGrant
from egress.parking import (
    CLIENT_GONE,
    GRANTED,
    SUBSCRIBE_WAIT_SECONDS,
    UNAVAILABLE,
    ApprovalDesk,
)
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


@pytest.fixture
def parked(desk):
    """Parks a request in a thread of its own, as a proxy's connection thread does; the
    future gives the status it ends with. When the test ends, the client is gone: a
    request a failed test left parked ends within half a second, not at its expiry."""
    test_over = threading.Event()

    def park(request, client_gone=lambda: False):
        def gone():
            return test_over.is_set() or client_gone()

        return pool.submit(desk.park_and_wait, **request, client_gone=gone)

    desk.start()
    with ThreadPoolExecutor(1) as pool:
        yield park
        test_over.set()


def the_parked_request():
    deadline = time.monotonic() + 10
    while not (approval := ApprovalRequest.objects.first()):
        assert time.monotonic() < deadline, "the request was never parked"
        time.sleep(0.05)
    return approval


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


def test_a_parked_request_goes_on_when_its_owner_approves_it(parked, request_to_park, owner):
    waiting = parked(request_to_park)
    approval = the_parked_request()
    assert not waiting.done()
    services.decide_approval(user=owner, approval_id=approval.pk, decision="approve_once")
    assert waiting.result(timeout=10) == ApprovalRequest.Status.APPROVED


def test_an_approval_that_comes_as_the_sandbox_hangs_up_sends_nothing(
    parked, request_to_park, owner
):
    asked = []

    def client_gone():
        """Still there when first asked, and the owner approves at that moment; gone
        when asked again, as the proxy does before it sends an approved request."""
        asked.append(time.monotonic())
        if len(asked) > 1:
            return True
        approval = ApprovalRequest.objects.get()
        services.decide_approval(user=owner, approval_id=approval.pk, decision="approve_once")
        connection.close()  # this thread's
        return False

    assert parked(request_to_park, client_gone=client_gone).result(timeout=10) == CLIENT_GONE
    assert ApprovalRequest.objects.get().status == ApprovalRequest.Status.APPROVED


def test_a_request_a_session_grant_covers_is_not_parked(desk, request_to_park):
    SessionGrant.objects.create(
        session_id=request_to_park["session_id"],
        app_id=request_to_park["app_id"],
        action_key="issues.create",
    )
    desk.start()
    assert desk.park_and_wait(**request_to_park) == GRANTED
    assert not ApprovalRequest.objects.exists()


def test_a_request_that_cannot_be_recorded_fails_closed(desk, request_to_park):
    desk.start()
    assert desk.park_and_wait(**{**request_to_park, "session_id": 10**9}) == UNAVAILABLE
    assert not ApprovalRequest.objects.exists()
