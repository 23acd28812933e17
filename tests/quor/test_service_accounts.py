"""Service accounts: an organization's integrations, with tokens limited to the scopes
each API operation declares, to a lifetime, and to the account being enabled."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from quor.models import AuditEntry, Membership, ServiceAccount, ServiceAccountToken
from tests import factories

pytestmark = pytest.mark.django_db
ACCOUNTS = "/api/v1/service-accounts/"


def bearer(raw_token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
    return client


@pytest.fixture
def admin_api(client_for, org_admin):
    return client_for(org_admin)


def make_account(admin_api, scopes, name="CI"):
    created = admin_api.post(ACCOUNTS, {"name": name, "scopes": scopes}, format="json")
    assert created.status_code == 201, created.content
    account = created.json()
    token = admin_api.post(f"{ACCOUNTS}{account['id']}/tokens/", {}, format="json")
    assert token.status_code == 201, token.content
    return account, token.json()["token"]


def test_a_token_does_what_its_scopes_allow_and_nothing_else(admin_api, org, owner):
    account, raw = make_account(admin_api, ["sessions"])
    robot = bearer(raw)
    assert robot.get("/api/v1/sessions/").status_code == 200
    session = factories.make_session(ServiceAccount.objects.get(pk=account["id"]).user)
    exec_response = robot.post(
        f"/api/v1/sessions/{session.pk}/exec/", {"argv": ["true"]}, format="json"
    )
    assert exec_response.status_code == 403
    assert exec_response.json()["error"]["code"] == "access.scope_required"
    assert "'exec' scope" in exec_response.json()["error"]["message"]
    for path in ["/api/v1/me/", "/api/v1/model-providers/", ACCOUNTS, "/api/v1/tokens/"]:
        response = robot.get(path)
        assert response.status_code == 403, path
        assert response.json()["error"]["code"] == "access.scope_required"
    # A member's session is not the account's.
    theirs = factories.make_session(owner)
    assert robot.get(f"/api/v1/sessions/{theirs.pk}/").status_code == 404


def test_changed_scopes_hold_at_the_tokens_next_request(admin_api, org):
    account, raw = make_account(admin_api, ["sessions"])
    robot = bearer(raw)
    session = factories.make_session(ServiceAccount.objects.get(pk=account["id"]).user)
    events = f"/api/v1/sessions/{session.pk}/events/"
    assert robot.get(events).status_code == 403
    changed = admin_api.patch(
        f"{ACCOUNTS}{account['id']}/", {"scopes": ["events", "sessions"]}, format="json"
    )
    assert changed.status_code == 200
    assert robot.get(events).status_code == 200
    [entry] = AuditEntry.objects.filter(action="service_account.changed")
    assert entry.changes == {"scopes": [["sessions"], ["events", "sessions"]]}


def test_tokens_rotate_expire_and_are_revoked_and_a_disabled_account_has_none(admin_api, org):
    account, first = make_account(admin_api, ["sessions"])
    tokens_url = f"{ACCOUNTS}{account['id']}/tokens/"
    second = admin_api.post(tokens_url, {"lifetime_days": 7}, format="json").json()
    assert bearer(first).get("/api/v1/sessions/").status_code == 200
    assert bearer(second["token"]).get("/api/v1/sessions/").status_code == 200

    first_id = ServiceAccountToken.objects.get(prefix=first[:15]).pk
    assert admin_api.delete(f"{tokens_url}{first_id}/").status_code == 204
    assert bearer(first).get("/api/v1/sessions/").status_code == 401
    assert bearer(second["token"]).get("/api/v1/sessions/").status_code == 200

    ServiceAccountToken.objects.filter(pk=second["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert bearer(second["token"]).get("/api/v1/sessions/").status_code == 401

    third = admin_api.post(tokens_url, {}, format="json").json()["token"]
    assert admin_api.delete(f"{ACCOUNTS}{account['id']}/").status_code == 204
    assert bearer(third).get("/api/v1/sessions/").status_code == 401
    refused = admin_api.post(tokens_url, {}, format="json")
    assert (refused.status_code, refused.json()["error"]["code"]) == (
        409,
        "service_accounts.disabled",
    )
    actions = list(
        AuditEntry.objects.filter(action__startswith="service_account.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "service_account.added",
        "service_account.token_created",
        "service_account.token_created",
        "service_account.token_revoked",
        "service_account.token_created",
        "service_account.disabled",
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "CI", "scopes": []}, "scopes"),
        ({"name": "CI", "scopes": ["admin"]}, "scopes"),
        ({"name": "", "scopes": ["sessions"]}, "name"),
        ({"name": "CI", "scopes": ["sessions"], "role": "owner"}, "role"),
    ],
)
def test_bad_service_accounts_are_refused_and_nothing_is_created(admin_api, body, field):
    response = admin_api.post(ACCOUNTS, body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not ServiceAccount.objects.exists()
    assert not Membership.objects.filter(user__email__endswith=".invalid").exists()


def test_bad_token_lifetimes_are_refused(admin_api):
    account, _ = make_account(admin_api, ["sessions"])
    for lifetime in (0, 366, "soon"):
        response = admin_api.post(
            f"{ACCOUNTS}{account['id']}/tokens/", {"lifetime_days": lifetime}, format="json"
        )
        assert response.status_code == 400, lifetime
    assert ServiceAccountToken.objects.count() == 1


def test_members_may_not_manage_service_accounts_and_auditors_only_read(client_for, org):
    member = factories.make_user(org, email="m@acme.test")
    auditor = factories.make_user(org, role=Membership.Role.AUDITOR, email="a@acme.test")
    body = {"name": "CI", "scopes": ["sessions"]}
    assert client_for(member).get(ACCOUNTS).status_code == 403
    assert client_for(member).post(ACCOUNTS, body, format="json").status_code == 403
    assert client_for(auditor).get(ACCOUNTS).status_code == 200
    assert client_for(auditor).post(ACCOUNTS, body, format="json").status_code == 403


def test_the_schema_lists_each_operations_scope(api_client):
    schema = api_client.get("/api/schema/?format=json").json()

    def security(path, method):
        return schema["paths"][path][method].get("security", [])

    assert {"serviceAccountToken": ["sessions"]} in security("/api/v1/sessions/", "get")
    exec_security = security("/api/v1/sessions/{session_id}/exec/", "post")
    assert {"serviceAccountToken": ["exec"]} in exec_security
    assert {"serviceAccountToken": ["events"]} in security("/api/v1/sessions/{id}/events/", "get")
    providers = security("/api/v1/model-providers/", "get")
    assert not any("serviceAccountToken" in requirement for requirement in providers)
    assert "serviceAccountToken" in schema["components"]["securitySchemes"]
