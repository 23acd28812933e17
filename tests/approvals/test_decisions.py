"""Deciding approval requests: who may, when, and what each decision leaves behind."""

import json
import uuid
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from approvals import services, wakeup
from approvals.models import ApprovalRequest, SessionGrant
from sandboxes.models import Session
from sandboxes.sessions import services as sessions
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def app(org):
    return factories.make_app(
        org,
        name="FakeHub",
        actions=[
            ("issues.create", "POST", "/repos/{o}/{r}/issues", "ask"),
            ("pulls.merge", "PUT", "/repos/{o}/{r}/pulls/{n}/merge", "ask"),
        ],
    )


@pytest.fixture
def session(owner, app):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    session.apps.set([app])
    return session


def park(session, app, key="issues.create", body=b""):
    return services.park_request_for_approval(
        approval_id=uuid.uuid4(),
        session_id=session.pk,
        app_id=app.pk,
        app_name=app.name,
        actions=[{"key": key, "name": key, "policy": "ask"}],
        method="POST",
        url="https://apps.test/repos/o/r/issues",
        summary=f"{app.name}: {key}",
        body=body,
    )


def test_the_card_shows_the_start_of_the_body_as_text(session, app):
    approval = park(session, app, body=b'{"title": "Bug"}\x1b[31m\n')
    [event] = session.events.all()
    assert event.payload["approval"]["body_preview"] == '{"title": "Bug"}[31m\n'
    assert approval.body_preview == '{"title": "Bug"}[31m\n'

    long = services.request_body_preview(b"x" * 100_000)
    assert long == "x" * services.BODY_PREVIEW_CHARS + "… (100000 bytes in all)"
    assert services.request_body_preview(b"\x89PNG\x00\x01") == "(binary data, 6 bytes)"
    assert services.request_body_preview(b"caf\xc3") == "caf\ufffd"
    assert park(session, app).body_preview == ""


def test_the_card_masks_secret_looking_values_of_form_and_json_bodies(session, app):
    # The preview stays with the approval and its event: what is obviously a secret
    # never gets there; everything else stays readable, to judge the request by.
    form = b"grant_type=client_credentials&client_id=quor&client_secret=s3cr%2Ft&password=hunter2"
    approval = park(session, app, body=form)
    expected = "grant_type=client_credentials&client_id=quor&client_secret=***&password=***"
    assert approval.body_preview == expected
    [event] = session.events.all()
    assert event.payload["approval"]["body_preview"] == expected

    body = {"title": "Bug", "token": "ghp_abc", "max_tokens": 100, "author": "Ada"}
    body["auth"] = {"apiKey": "k1", "Authorization": "Bearer x"}
    preview = services.request_body_preview(json.dumps(body, indent=2).encode())
    for secret in ("ghp_abc", "k1", "Bearer x"):
        assert secret not in preview
    assert '"token": "***"' in preview and '"apiKey": "***"' in preview
    assert '"title": "Bug"' in preview and '"max_tokens": 100' in preview
    assert '"author": "Ada"' in preview

    # JSON cut off in the middle of a secret.
    assert services.request_body_preview(b'{"a": 1, "password": "hunter2') == (
        '{"a": 1, "password": "***"'
    )


def decide(client, approval, decision):
    return client.post(
        f"/api/v1/approvals/{approval.pk}/decision/", {"decision": decision}, format="json"
    )


def test_parking_records_the_request_and_sends_a_card_to_the_session(session, app):
    approval = park(session, app)
    assert approval.status == "pending"
    expected = settings.QUOR_APPROVAL_TIMEOUT_SECONDS
    assert abs((approval.expires_at - approval.created_at).total_seconds() - expected) < 2
    [event] = session.events.all()
    assert event.kind == "approval_requested"
    assert event.payload["approval"]["id"] == str(approval.pk)


def test_the_owner_approves_and_the_waiting_proxy_hears_it_through_redis(
    session, app, owner, client_for
):
    approval = park(session, app)
    subscriber = redis.Redis.from_url(settings.REDIS_URL).pubsub(ignore_subscribe_messages=True)
    subscriber.subscribe(wakeup.channel())
    subscriber.get_message(timeout=1)
    response = decide(client_for(owner), approval, "approve_once")
    assert response.status_code == 200
    assert response.json()["status"] == "approved"
    message = subscriber.get_message(timeout=2)
    assert json.loads(message["data"])["decisions"] == [
        {"id": str(approval.pk), "status": "approved"}
    ]
    approval.refresh_from_db()
    assert (approval.decided_via, approval.decided_by) == ("user", owner)
    assert [e.kind for e in session.events.order_by("seq")] == [
        "approval_requested",
        "approval_decided",
    ]


@pytest.mark.parametrize("who", ["colleague", "org_admin", "stranger", "superuser"])
def test_only_the_session_owner_can_decide(session, app, client_for, request, who):
    approval = park(session, app)
    response = decide(client_for(request.getfixturevalue(who)), approval, "approve_once")
    assert response.status_code in (403, 404)
    if response.status_code == 404:
        assert response.json()["error"]["code"] == "approvals.not_found"
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_anonymous_requests_are_refused(session, app, api_client):
    approval = park(session, app)
    assert decide(api_client, approval, "reject").status_code == 401


def test_deciding_twice_is_a_conflict_and_changes_nothing(session, app, owner, client_for):
    approval = park(session, app)
    client = client_for(owner)
    assert decide(client, approval, "reject").status_code == 200
    response = decide(client, approval, "approve_once")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "approvals.already_decided"
    approval.refresh_from_db()
    assert approval.status == "rejected"
    assert session.events.filter(kind="approval_decided").count() == 1


def test_an_expired_request_cannot_be_decided(session, app, owner, client_for):
    approval = park(session, app)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = decide(client_for(owner), approval, "approve_once")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "approvals.expired"
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert services.approvals_expire_stale() == 1
    approval.refresh_from_db()
    assert (approval.status, approval.decided_via) == ("expired", "proxy")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"decision": "yes"}, 400, "invalid_input"),
        ({}, 400, "invalid_input"),
        ({"decision": "reject", "extra": 1}, 400, "invalid_input"),
    ],
)
def test_bad_decisions_are_refused_and_change_nothing(
    session, app, owner, client_for, body, status, code
):
    approval = park(session, app)
    response = client_for(owner).post(
        f"/api/v1/approvals/{approval.pk}/decision/", body, format="json"
    )
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_an_unknown_or_malformed_id_is_404(owner, client_for):
    client = client_for(owner)
    for approval_id in [uuid.uuid4(), "not-a-uuid"]:
        response = client.post(
            f"/api/v1/approvals/{approval_id}/decision/", {"decision": "reject"}, format="json"
        )
        assert response.status_code == 404


def test_approving_for_the_session_grants_the_action_and_releases_covered_requests(
    session, app, owner, client_for
):
    first, second = park(session, app), park(session, app)
    other_action = park(session, app, key="pulls.merge")
    decide(client_for(owner), first, "approve_session")
    assert list(SessionGrant.objects.values_list("app_id", "action_key")) == [
        (app.pk, "issues.create")
    ]
    statuses = {
        a.pk: (a.status, a.decided_via)
        for a in ApprovalRequest.objects.filter(pk__in=[first.pk, second.pk, other_action.pk])
    }
    assert statuses[first.pk] == ("approved", "session_grant")
    assert statuses[second.pk] == ("approved", "session_grant")
    assert statuses[other_action.pk] == ("pending", "")
    assert park(session, app) is None  # a later request is covered: no card


def test_cancelling_the_turn_expires_its_parked_requests(session, app, owner):
    approval = park(session, app)
    sessions.session_cancel(user=owner, session=session)
    approval.refresh_from_db()
    assert (approval.status, approval.decided_via) == ("expired", "cancel")


def test_the_session_lists_its_approvals(session, app, owner, colleague, client_for):
    approval = park(session, app)
    response = client_for(owner).get(f"/api/v1/sessions/{session.pk}/approvals/?status=pending")
    assert [a["id"] for a in response.json()["results"]] == [str(approval.pk)]
    assert (
        client_for(owner)
        .get(f"/api/v1/sessions/{session.pk}/approvals/?status=approved")
        .json()["results"]
        == []
    )
    bad = client_for(owner).get(f"/api/v1/sessions/{session.pk}/approvals/?status=nope")
    assert bad.json()["error"]["code"] == "approvals.invalid_status"
    assert client_for(colleague).get(f"/api/v1/sessions/{session.pk}/approvals/").status_code == 404


def test_settling_keeps_a_recorded_decision(session, app, owner, client_for):
    approval = park(session, app)
    decide(client_for(owner), approval, "approve_once")
    assert services.approval_settle(approval.pk) == "approved"
    unanswered = park(session, app, key="pulls.merge")
    assert services.approval_settle(unanswered.pk) == "expired"
