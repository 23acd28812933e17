"""Deactivating a member takes their access away everywhere, in the deactivation's own
transaction, whichever way it is asked for (the admin, the operator API). The running
parts (turns, the sandbox, open event streams) are in test_deactivation_e2e.py."""

import uuid

import pytest
from django.contrib.sessions.models import Session as LoginSession
from django.test import Client
from django.urls import reverse

from approvals import services as approvals
from approvals.models import ApprovalRequest
from egress.directory import load_contexts
from quor import services
from quor.models import ApiToken, AuditEntry, Membership, User
from sandboxes.models import Sandbox, Session
from sandboxes.runtime import services as runtime
from tests import factories
from tests.quor.test_operator_api import TOKEN, operator
from webapps import services as webapps
from webapps.models import WebApp

pytestmark = pytest.mark.django_db(transaction=True)

MEMBERS = reverse("admin:quor_membership_changelist")


@pytest.fixture(autouse=True)
def operator_token(settings):
    settings.QUOR_OPERATOR_TOKEN = TOKEN


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def deactivate_in_admin(editor, *members) -> Client:
    client = logged_in(editor)
    response = client.post(
        MEMBERS,
        {"action": "deactivate_members", "_selected_action": [m.membership.pk for m in members]},
    )
    assert response.status_code == 302
    return client


def parked_request(session, app):
    return approvals.park_request_for_approval(
        approval_id=uuid.uuid4(),
        session_id=session.pk,
        app_id=app.pk,
        app_name=app.name,
        actions=[{"key": "issues.create", "name": "issues.create", "policy": "ask"}],
        method="POST",
        url="https://apps.test/repos/o/r/issues",
        summary="FakeHub: issues.create",
    )


def test_an_admin_deactivating_a_member_ends_their_logins_and_tokens_at_once(
    owner, org_admin, client_for
):
    browser = logged_in(owner)
    assert browser.get("/").status_code == 200
    api = client_for(owner)
    assert api.get("/api/v1/sessions/").status_code == 200

    deactivate_in_admin(org_admin, owner)

    owner.refresh_from_db()
    assert not owner.is_active
    response = browser.get("/")
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert api.get("/api/v1/sessions/").status_code == 401
    assert not ApiToken.objects.filter(user=owner, revoked_at__isnull=True).exists()
    assert not any(
        s.get_decoded().get("_auth_user_id") == str(owner.pk) for s in LoginSession.objects.all()
    )
    assert logged_in(org_admin).get("/").status_code == 200  # the others' stay
    entry = AuditEntry.objects.get(action="user.deactivated")
    assert (entry.actor, entry.target_id) == (org_admin, str(owner.pk))
    assert entry.changes == {
        "is_active": [True, False],
        "via": "admin",
        "login_sessions_ended": 1,
        "api_tokens_revoked": 1,
    }


def test_the_password_no_longer_logs_a_deactivated_member_in(owner, org_admin):
    deactivate_in_admin(org_admin, owner)
    browser = Client()
    response = browser.post(
        reverse("login"), {"username": owner.email, "password": factories.PASSWORD}
    )
    assert response.status_code == 200  # the form again, with its error
    assert "_auth_user_id" not in browser.session


def test_parked_approvals_fail_closed_in_the_deactivation_itself(owner, org):
    app = factories.make_app(org, name="FakeHub")
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    approval = parked_request(session, app)
    other = parked_request(factories.make_session(factories.make_user(org)), app)

    services.user_deactivate(user=owner, via="operator")

    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.EXPIRED
    assert approvals.approval_settle(approval.pk) == ApprovalRequest.Status.EXPIRED
    other.refresh_from_db()
    assert other.status == ApprovalRequest.Status.PENDING


def test_a_deactivated_owners_shared_web_app_is_closed_to_everyone(owner, colleague):
    session = factories.make_session(owner, sharing=Session.Sharing.ORGANIZATION)
    webapp = WebApp.objects.create(session=session, port=8080, command="python3 -m http.server")
    assert webapps.can_view(colleague, webapp)

    services.user_deactivate(user=owner, via="operator")

    webapp.refresh_from_db()
    assert not webapps.can_view(colleague, webapp)
    assert logged_in(colleague).get(f"/webapps/{webapp.label}/open").status_code == 404


def test_nothing_wakes_a_deactivated_users_sandbox(owner):
    sandbox = factories.make_sandbox(owner, state=Sandbox.State.SLEEPING)
    services.user_deactivate(user=owner, via="operator")
    with pytest.raises(runtime.SandboxUnavailable, match="deactivated"):
        runtime.sandbox_ensure_running(sandbox)


def test_the_egress_proxy_forgets_a_deactivated_users_sandbox(owner, colleague):
    factories.make_sandbox(owner, network_address="10.99.0.2", state=Sandbox.State.RUNNING)
    factories.make_sandbox(colleague, network_address="10.99.0.3", state=Sandbox.State.RUNNING)
    assert {"10.99.0.2", "10.99.0.3"} <= load_contexts().keys()

    services.user_deactivate(user=owner, via="operator")

    contexts = load_contexts()
    assert "10.99.0.2" not in contexts and "10.99.0.3" in contexts


def test_the_operator_deactivates_and_reactivates_a_member(owner, client_for):
    api = client_for(owner)
    url = f"/api/operator/v1/organizations/acme/members/{owner.membership.pk}/"
    response = operator().patch(url, {"is_active": False}, format="json")
    assert response.status_code == 200 and response.json()["is_active"] is False
    assert api.get("/api/v1/sessions/").status_code == 401

    response = operator().patch(url, {"is_active": True}, format="json")
    assert response.status_code == 200 and response.json()["is_active"] is True
    assert api.get("/api/v1/sessions/").status_code == 401  # what ended stays ended
    assert logged_in(owner).get("/").status_code == 200
    assert list(
        AuditEntry.objects.filter(target_id=str(owner.pk), action__startswith="user.")
        .order_by("pk")
        .values_list("action", "changes__via")
    ) == [("user.deactivated", "operator"), ("user.reactivated", "operator")]


def test_a_malformed_deactivation_changes_nothing(owner):
    url = f"/api/operator/v1/organizations/acme/members/{owner.membership.pk}/"
    response = operator().patch(url, {"is_active": "maybe"}, format="json")
    assert response.status_code == 400
    owner.refresh_from_db()
    assert owner.is_active
    assert not AuditEntry.objects.filter(action="user.deactivated").exists()


def test_an_admin_may_not_deactivate_an_owner_nor_another_organizations_member(
    owner, org_admin, stranger
):
    Membership.objects.filter(user=owner).update(role=Membership.Role.OWNER)
    owner.refresh_from_db()
    client = deactivate_in_admin(org_admin, owner, stranger)
    assert "Only an owner manages owners and admins." in client.get(MEMBERS).content.decode()
    assert User.objects.filter(pk__in=[owner.pk, stranger.pk], is_active=True).count() == 2


def test_deactivating_again_finishes_the_work_without_a_second_record(owner, org):
    services.user_deactivate(user=owner, via="scim")
    app = factories.make_app(org, name="FakeHub")
    approval = parked_request(factories.make_session(owner), app)  # left by a crash

    services.user_deactivate(user=owner, via="scim")

    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.EXPIRED
    assert AuditEntry.objects.filter(action="user.deactivated").count() == 1


def test_deleting_a_user_deactivates_them_first_then_removes_their_sessions(owner, org):
    app = factories.make_app(org, name="FakeHub")
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    approval = parked_request(session, app)
    browser = logged_in(owner)

    services.user_delete(user=owner, via="scim")

    assert not User.objects.filter(pk=owner.pk).exists()
    assert not Session.objects.filter(pk=session.pk).exists()
    assert not ApprovalRequest.objects.filter(pk=approval.pk).exists()
    assert browser.get("/").status_code == 302
    assert list(
        AuditEntry.objects.filter(target_id=str(owner.pk), action__startswith="user.")
        .order_by("pk")
        .values_list("action", flat=True)
    ) == ["user.deactivated", "user.deleted"]


def test_a_superuser_deleting_a_user_in_the_admin_ends_their_access_first(
    owner, superuser, client_for
):
    api = client_for(owner)
    browser = logged_in(owner)
    response = logged_in(superuser).post(
        reverse("admin:quor_user_delete", args=[owner.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not User.objects.filter(pk=owner.pk).exists()
    assert browser.get("/").status_code == 302
    assert api.get("/api/v1/sessions/").status_code == 401
    assert list(
        AuditEntry.objects.filter(target_id=str(owner.pk), action__startswith="user.")
        .order_by("pk")
        .values_list("action", "actor")
    ) == [("user.deactivated", superuser.pk), ("user.deleted", superuser.pk)]
