"""The operator API: the operator token (its rules and its rotation) and what it may do
across organizations, each call in the audit log."""

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.utils import timezone
from rest_framework.test import APIClient

from quor.models import AuditEntry, Membership, Organization
from sandboxes.models import Sandbox
from sandboxes.runtime import tasks as sandbox_tasks
from tests import factories

pytestmark = pytest.mark.django_db
TOKEN = "operator-token-0123456789-abcdefghijklmnop"
OLD_TOKEN = "old-operator-token-0123456789-abcdefghijk"
BASE = "/api/operator/v1/"


@pytest.fixture(autouse=True)
def operator_token(settings):
    settings.QUOR_OPERATOR_TOKEN = TOKEN
    settings.QUOR_OPERATOR_TOKEN_PREVIOUS = ""
    settings.QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL = ""


def operator(token=TOKEN):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.mark.parametrize("token", ["", "wrong" * 10, TOKEN[:-1], TOKEN + "x"])
def test_anything_but_the_operator_token_is_401(token, org):
    client = operator(token) if token else APIClient()
    assert client.get(f"{BASE}organizations/").status_code == 401


def test_a_superusers_personal_token_is_not_the_operator_token(superuser, client_for):
    assert client_for(superuser).get(f"{BASE}organizations/").status_code == 401


def test_the_operator_token_does_not_open_the_users_api(org):
    assert operator().get("/api/v1/me/").status_code == 401


def test_an_empty_operator_token_setting_opens_nothing(settings, org):
    settings.QUOR_OPERATOR_TOKEN = ""
    assert operator("").get(f"{BASE}organizations/").status_code == 401
    assert operator(" ").get(f"{BASE}organizations/").status_code == 401


def test_the_previous_token_works_until_its_time_then_not(settings, org):
    settings.QUOR_OPERATOR_TOKEN_PREVIOUS = OLD_TOKEN
    settings.QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL = (timezone.now() + timedelta(hours=1)).isoformat()
    assert operator(OLD_TOKEN).get(f"{BASE}organizations/").status_code == 200
    assert operator(TOKEN).get(f"{BASE}organizations/").status_code == 200
    settings.QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL = (
        timezone.now() - timedelta(seconds=1)
    ).isoformat()
    assert operator(OLD_TOKEN).get(f"{BASE}organizations/").status_code == 401
    assert operator(TOKEN).get(f"{BASE}organizations/").status_code == 200


@pytest.mark.parametrize(
    ("current", "previous", "until", "message"),
    [
        ("short", "", "", "QUOR_OPERATOR_TOKEN is shorter than 32"),
        (TOKEN, "short", "2099-01-01T00:00:00+00:00", "QUOR_OPERATOR_TOKEN_PREVIOUS is shorter"),
        (TOKEN, TOKEN, "2099-01-01T00:00:00+00:00", "without a different QUOR_OPERATOR_TOKEN"),
        (TOKEN, OLD_TOKEN, "", "QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL must be"),
        (TOKEN, OLD_TOKEN, "2099-01-01T00:00:00", "QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL must be"),
    ],
)
def test_startup_refuses_unsafe_operator_tokens(settings, current, previous, until, message):
    settings.QUOR_OPERATOR_TOKEN = current
    settings.QUOR_OPERATOR_TOKEN_PREVIOUS = previous
    settings.QUOR_OPERATOR_TOKEN_PREVIOUS_UNTIL = until
    with pytest.raises(SystemCheckError, match=message):
        call_command("check")


def test_the_operator_creates_an_organization_and_its_first_owner():
    client = operator()
    created = client.post(
        f"{BASE}organizations/", {"slug": "initech", "name": "Initech"}, format="json"
    )
    assert created.status_code == 201, created.content
    member = client.post(
        f"{BASE}organizations/initech/members/",
        {"email": "Bill@Initech.test", "role": "owner"},
        format="json",
    )
    assert member.status_code == 201, member.content
    assert member.json() | {"id": 0, "created_at": ""} == {
        "id": 0, "email": "bill@initech.test", "role": "owner", "can_use_sandbox": True,
        "is_active": True, "created_at": "",
    }  # fmt: skip
    listed = client.get(f"{BASE}organizations/initech/members/").json()["results"]
    assert [m["email"] for m in listed] == ["bill@initech.test"]
    actions = [e.action for e in AuditEntry.objects.order_by("id")]
    assert actions == [
        "organization.added",
        "operator.request",
        "member.added",
        "operator.request",
        "operator.request",
    ]
    assert {e.actor_label for e in AuditEntry.objects.all()} == {"operator"}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"slug": "acme", "name": "Again"}, 409, "organizations.exists"),
        ({"slug": "no spaces", "name": "X"}, 400, "invalid_input"),
        ({"slug": "ok", "name": ""}, 400, "invalid_input"),
        ({"slug": "ok", "name": "X", "owner": "me"}, 400, "invalid_input"),
    ],
)
def test_bad_organizations_are_refused_and_nothing_is_created(org, body, status, code):
    response = operator().post(f"{BASE}organizations/", body, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    assert list(Organization.objects.values_list("slug", flat=True)) == ["acme"]
    assert not AuditEntry.objects.exclude(action="operator.request").exists()


def test_disabling_an_organization_locks_its_members_out(org, owner, client_for):
    member_api = client_for(owner)
    assert member_api.get("/api/v1/me/").status_code == 200
    response = operator().patch(f"{BASE}organizations/acme/", {"is_active": False}, format="json")
    assert response.status_code == 200
    assert member_api.get("/api/v1/me/").json()["error"]["code"] == "access.organization_disabled"
    [entry] = AuditEntry.objects.filter(action="organization.changed")
    assert entry.changes == {"is_active": [True, False]}


def test_the_operator_changes_roles_but_never_leaves_an_organization_without_owner(org):
    boss = factories.make_user(org, role=Membership.Role.OWNER, email="boss@acme.test")
    url = f"{BASE}organizations/acme/members/{boss.membership.pk}/"
    refused = operator().patch(url, {"role": "member"}, format="json")
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "members.last_owner")
    second = factories.make_user(org, email="second@acme.test")
    second_url = f"{BASE}organizations/acme/members/{second.membership.pk}/"
    assert operator().patch(second_url, {"role": "owner"}, format="json").status_code == 200
    assert operator().patch(url, {"role": "auditor"}, format="json").json()["role"] == "auditor"
    changes = [e.changes for e in AuditEntry.objects.filter(action="member.changed").order_by("id")]
    assert changes == [{"role": ["member", "owner"]}, {"role": ["owner", "auditor"]}]


def test_a_member_of_another_organization_is_not_found_through_this_one(org, stranger):
    url = f"{BASE}organizations/acme/members/{stranger.membership.pk}/"
    response = operator().patch(url, {"role": "owner"}, format="json")
    assert response.status_code == 404
    stranger.membership.refresh_from_db()
    assert stranger.membership.role == "member"


@pytest.mark.docker  # the destroy task removes the runtime through the Docker Engine
def test_the_operator_sees_every_organizations_sandboxes_and_stops_one(
    owner, stranger, django_capture_on_commit_callbacks
):
    ours = factories.make_sandbox(owner, state=Sandbox.State.STOPPED)
    factories.make_sandbox(stranger, state=Sandbox.State.ABSENT)
    listed = operator().get(f"{BASE}sandboxes/").json()["results"]
    assert {(s["owner"], s["organization"]) for s in listed} == {
        ("owner@acme.test", "acme"), ("stranger@globex.test", "globex")
    }  # fmt: skip
    only = operator().get(f"{BASE}sandboxes/?organization=acme").json()["results"]
    assert [s["id"] for s in only] == [str(ours.pk)]

    with django_capture_on_commit_callbacks() as callbacks:
        response = operator().post(f"{BASE}sandboxes/{ours.pk}/destroy/", {}, format="json")
    assert response.status_code == 202
    assert len(callbacks) == 1  # the task is sent once the request committed
    sandbox_tasks.destroy_sandbox(str(ours.pk))
    sandbox_tasks.destroy_sandbox(str(ours.pk))  # a task may run twice
    ours.refresh_from_db()
    assert ours.state == Sandbox.State.ABSENT
    [entry] = AuditEntry.objects.filter(action="sandbox.destroy_requested")
    assert entry.organization == ours.user.membership.organization
    assert operator().post(f"{BASE}sandboxes/not-a-uuid/stop/").status_code == 404


def test_the_audit_export_is_json_lines_filtered_by_organization_and_time(org, stranger):
    operator().patch(f"{BASE}organizations/acme/", {"name": "Acme Corp"}, format="json")
    operator().patch(f"{BASE}organizations/globex/", {"name": "Globex Corp"}, format="json")
    since = (timezone.now() - timedelta(minutes=1)).isoformat()
    response = operator().get(
        f"{BASE}audit/",
        {"organization": "acme", "action": "organization.changed", "since": since},
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [(r["organization"], r["actor"], r["changes"]) for r in lines] == [
        ("acme", "operator", {"name": ["Acme", "Acme Corp"]})
    ]
    later = operator().get(
        f"{BASE}audit/", {"since": timezone.now().isoformat(), "action": "organization.changed"}
    )
    assert b"".join(later.streaming_content) == b""
    bad = operator().get(f"{BASE}audit/", {"since": "yesterday"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "audit.invalid_time")
