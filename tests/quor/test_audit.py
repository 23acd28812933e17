"""The audit log records administrative and security-relevant changes: who, what
(before and after), when, from which request; never a secret; in the same transaction
as the change; visible by role in the admin; kept for the configured period."""

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps import services as app_services
from knowledge.models import KnowledgeSource
from quor import audit, services
from quor.models import AuditEntry, Membership
from quor.tasks import delete_old_audit_entries
from tests import factories

pytestmark = pytest.mark.django_db
SECRET = "ghp_audit-secret-value-0123456789abcdef"
PROVIDER_KEY = "sk-ant-audit-key-0123456789abcdef"


@pytest.fixture
def github(org):
    return app_services.app_enable_builtin(organization=org, catalog_key="github")


def entries(action):
    return list(AuditEntry.objects.filter(action=action).order_by("id"))


def test_a_policy_change_through_the_api_records_who_what_and_the_request(
    client_for, org_admin, github
):
    response = client_for(org_admin).patch(
        f"/api/v1/apps/{github.pk}/actions/delete_repository/",
        {"policy": "auto"},
        format="json",
        HTTP_X_REQUEST_ID="change-1234",
    )
    assert response.status_code == 200
    [entry] = entries("app.policy_changed")
    assert (entry.actor, entry.actor_label) == (org_admin, "admin@acme.test")
    assert entry.organization == github.organization
    assert entry.changes == {"delete_repository": ["deny", "auto"]}
    assert (entry.target_type, entry.target_id) == ("integrations.app", str(github.pk))
    assert entry.request_id == "change-1234"


def test_credentials_are_recorded_as_set_replaced_removed_and_never_by_value(
    client_for, org_admin, owner, github
):
    admin_api, member_api = client_for(org_admin), client_for(owner)
    url = f"/api/v1/apps/{github.pk}/credential/"
    for _ in range(2):
        body = {"scope": "organization", "secret": SECRET}
        assert admin_api.put(url, body, format="json").status_code == 200
    assert admin_api.delete(f"{url}?scope=organization").status_code == 204
    assert (
        member_api.put(url, {"scope": "user", "secret": SECRET}, format="json").status_code == 200
    )

    recorded = [(e.action, e.actor, e.changes["credential"]) for e in AuditEntry.objects.filter(
        action__startswith="app.credential_").order_by("id")]  # fmt: skip
    assert recorded == [
        ("app.credential_set", org_admin, "organization"),
        ("app.credential_replaced", org_admin, "organization"),
        ("app.credential_removed", org_admin, "organization"),
        ("app.credential_set", owner, "user owner@acme.test"),
    ]
    everything = json.dumps(list(AuditEntry.objects.values()), default=str)
    assert SECRET not in everything


def test_a_provider_key_change_says_replaced_and_the_other_fields_before_and_after(
    client_for, org_admin, org
):
    api = client_for(org_admin)
    created = api.post(
        "/api/v1/model-providers/",
        {"kind": "anthropic", "display_name": "Claude", "api_key": PROVIDER_KEY,
         "model_names": ["claude-a"]},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    url = f"/api/v1/model-providers/{created.json()['id']}/"
    changed = api.patch(
        url, {"api_key": PROVIDER_KEY + "2", "model_names": ["claude-b"]}, format="json"
    )
    assert changed.status_code == 200
    [added] = entries("model_provider.added")
    assert added.changes["api_key"] == "set"
    [entry] = entries("model_provider.changed")
    assert entry.changes == {
        "api_key": ["set", "replaced"],
        "model_names": [["claude-a"], ["claude-b"]],
    }
    assert PROVIDER_KEY not in json.dumps(list(AuditEntry.objects.values()), default=str)


def test_a_refused_change_records_nothing(client_for, org_admin, owner, org):
    provider = factories.make_provider(org)
    factories.make_session(owner, provider)  # in use: it cannot be deleted
    api = client_for(org_admin)
    before = AuditEntry.objects.count()
    response = api.delete(f"/api/v1/model-providers/{provider.pk}/")
    assert response.status_code == 409
    bad = api.patch(
        f"/api/v1/model-providers/{provider.pk}/", {"model_names": "nope"}, format="json"
    )
    assert bad.status_code == 400
    assert AuditEntry.objects.count() == before


def test_tokens_and_approval_decisions_and_sharing_are_recorded(owner, org):
    token, _ = services.api_token_create(user=owner, name="laptop")
    services.api_token_revoke(user=owner, token_id=token.pk)
    services.api_token_revoke(user=owner, token_id=token.pk)  # twice: one revocation
    tokens = AuditEntry.objects.filter(target_type="quor.apitoken", target_id=str(token.pk))
    assert [e.action for e in tokens] == [
        "api_token.revoked",
        "api_token.created",
    ]
    assert {e.organization for e in AuditEntry.objects.all()} == {org}

    from webapps.services import session_set_sharing

    session = factories.make_session(owner)
    session_set_sharing(user=owner, session=session, sharing="organization")
    [entry] = entries("session.sharing_changed")
    assert entry.changes == {"sharing": ["private", "organization"]}
    assert entry.actor == owner


def test_a_role_change_in_the_admin_records_before_and_after(org):
    first_owner = factories.make_user(org, role=Membership.Role.OWNER, email="boss@acme.test")
    member = factories.make_user(org, email="m@acme.test")
    browser = Client()
    browser.force_login(first_owner)
    url = f"/admin/quor/membership/{member.membership.pk}/change/"
    response = browser.post(url, {"role": "admin", "can_use_sandbox": "on"})
    assert response.status_code == 302, response.content[:2000]
    [entry] = entries("member.changed")
    assert entry.changes == {"role": ["member", "admin"]}
    assert entry.actor == first_owner
    [admin_entry] = entries("admin.changed")
    assert admin_entry.organization == org
    assert admin_entry.request_id == entry.request_id != ""


def test_an_admin_may_not_make_anyone_owner_and_nothing_is_recorded(org, org_admin):
    member = factories.make_user(org, email="m@acme.test")
    browser = Client()
    browser.force_login(org_admin)
    url = f"/admin/quor/membership/{member.membership.pk}/change/"
    response = browser.post(url, {"role": "owner", "can_use_sandbox": "on"})
    assert response.status_code == 200  # the form again, with the error
    assert "Only an owner manages owners and admins." in response.content.decode()
    member.membership.refresh_from_db()
    assert member.membership.role == "member"
    assert not AuditEntry.objects.filter(action__in=["member.changed", "admin.changed"]).exists()


def test_each_object_of_a_bulk_delete_in_the_admin_is_recorded(org, org_admin):
    sources = [KnowledgeSource.objects.create(organization=org, name=f"S{i}") for i in range(2)]
    browser = Client()
    browser.force_login(org_admin)
    response = browser.post(
        "/admin/knowledge/knowledgesource/",
        {"action": "delete_selected", "_selected_action": [s.pk for s in sources], "post": "yes"},
    )
    assert response.status_code == 302
    assert not KnowledgeSource.objects.exists()
    deleted = entries("admin.deleted")
    assert sorted(e.target_id for e in deleted) == sorted(str(s.pk) for s in sources)
    assert {(e.actor, e.organization) for e in deleted} == {(org_admin, org)}


def test_the_admin_shows_an_auditor_their_organizations_entries_only(org, stranger):
    auditor = factories.make_user(org, role=Membership.Role.AUDITOR, email="a@acme.test")
    ours = audit.audit_record("app.added", organization=org, actor=auditor)
    theirs = audit.audit_record(
        "app.added", organization=stranger.membership.organization, actor=stranger
    )
    browser = Client()
    browser.force_login(auditor)
    page = browser.get("/admin/quor/auditentry/?action=app.added").content.decode()
    assert f"/admin/quor/auditentry/{ours.pk}/change/" in page
    assert f"/admin/quor/auditentry/{theirs.pk}/change/" not in page
    assert browser.get(f"/admin/quor/auditentry/{theirs.pk}/change/").status_code == 302
    assert browser.post(f"/admin/quor/auditentry/{ours.pk}/delete/").status_code == 403


def test_entries_older_than_the_retention_are_deleted(settings, org):
    settings.QUOR_AUDIT_RETENTION_DAYS = 30
    old = audit.audit_record("app.added", organization=org)
    recent = audit.audit_record("app.added", organization=org)
    AuditEntry.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=31))
    AuditEntry.objects.filter(pk=recent.pk).update(created_at=timezone.now() - timedelta(days=29))
    assert delete_old_audit_entries() == 1
    assert list(AuditEntry.objects.all()) == [recent]
