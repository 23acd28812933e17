"""An admin deactivates a member in the middle of a turn that waits for an approval, in
a real sandbox with the real proxy, web process and Celery worker: every part of their
access ends within seconds, and the App never sees the parked request."""

import time

import pytest
from asgiref.sync import sync_to_async

from approvals.models import ApprovalRequest
from quor.models import ModelProvider
from sandboxes.models import Sandbox, Session
from tests import factories
from tests.environment import PORTS
from tests.quor.test_deactivation import deactivate_in_admin, logged_in
from tests.sandboxes.test_event_stream import connect, cookie_for
from tests.scenarios import CONNECT_TIMEOUT_S, run_scenario

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

REPO = f"https://apps.test:{PORTS.TLS_APP}/repos/acme/widgets"
SCRIPT = [
    {
        "text": "Opening the issue.",
        "tool_calls": [
            {
                "name": "run_command",
                "input": {"command": f"curl -sS -X POST -d '{{}}' {REPO}/issues"},
            }
        ],
    },
    {"text": "The issue is open."},
]


def wait_for(predicate, timeout: float, what: str) -> float:
    """Seconds until `predicate()` held (polling PostgreSQL, the truth)."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"{what} not within {timeout} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_deactivating_a_member_mid_turn_ends_their_access_everywhere_within_seconds(
    client_for, owner, org, org_admin, egress_proxy, celery_worker, clean_runtimes, upstream_fakes
):
    provider = factories.make_provider(
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url=f"https://model.test:{PORTS.MODEL}",
        model_names=["scripted"],
    )  # fmt: skip
    app = factories.make_app(
        org,
        name="FakeHub",
        catalog_key="github",
        credential="ghp_deactivation-e2e-0123456789abcdef",
        actions=[("issues.create", "POST", "/repos/{owner}/{repo}/issues", "ask")],
    )
    upstream_fakes.model.script = SCRIPT
    upstream_fakes.tls_app.requests.clear()
    api = client_for(owner)
    response = api.post(
        "/api/v1/sessions/",
        {"prompt": "Open an issue.", "model": f"{provider.pk}:scripted", "apps": [app.pk]},
        format="json",
    )
    assert response.status_code == 201, response.json()
    session = Session.objects.get(pk=response.json()["id"])
    browser = logged_in(owner)
    cookie = cookie_for(owner)

    async def scenario():
        viewer = connect(session, cookie)
        connected, _ = await viewer.connect(CONNECT_TIMEOUT_S)
        assert connected
        while (await viewer.receive_json_from(timeout=120))["kind"] != "approval_requested":
            pass
        deactivated_at = time.monotonic()
        await sync_to_async(deactivate_in_admin)(org_admin, owner)
        while (message := await viewer.receive_output(timeout=10))["type"] != "websocket.close":
            pass
        return message["code"], time.monotonic() - deactivated_at

    close_code, stream_closed_after = run_scenario(scenario)

    assert close_code == 4401
    assert stream_closed_after < 10
    approval = ApprovalRequest.objects.get(session=session)
    assert approval.status == ApprovalRequest.Status.EXPIRED  # in the deactivation itself
    assert api.get("/api/v1/sessions/").status_code == 401
    assert browser.get("/").status_code == 302
    cancelled_after = wait_for(
        lambda: Session.objects.get(pk=session.pk).status == Session.Status.CANCELLED,
        30,
        "the turn cancelled",
    )
    asleep_after = wait_for(
        lambda: Sandbox.objects.get(user=owner).state == Sandbox.State.SLEEPING,
        120,
        "the sandbox asleep",
    )
    sandbox = Sandbox.objects.get(user=owner)
    assert sandbox.snapshots.exists()  # kept, per retention
    assert not sandbox.runtime_id and sandbox.network_address is None
    cancelled = session.events.get(kind="cancelled").payload
    assert cancelled == {"by": owner.email, "reason": "deactivated"}
    assert upstream_fakes.tls_app.requests == []
    print(
        f"stream closed {stream_closed_after:.2f} s, turn cancelled +{cancelled_after:.1f} s, "
        f"sandbox asleep +{asleep_after:.1f} s"
    )
