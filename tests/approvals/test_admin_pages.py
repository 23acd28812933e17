"""Approval requests in the Django admin: a read-only record that says who was asked,
in which session, about what; organization admins see only their organization's."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from sandboxes.models import Session
from tests import factories

CHANGELIST = reverse("admin:approvals_approvalrequest_changelist")


def change_url(approval):
    return reverse("admin:approvals_approvalrequest_change", args=[approval.pk])


def make_approval(user, app, **fields):
    session = factories.make_session(user, status=Session.Status.RUNNING, title="Fix the build")
    fields.setdefault(
        "actions",
        [
            {"key": "issues.create", "name": "Create an issue", "policy": "ask"},
            {"key": "issues.read", "name": "Read issues", "policy": "auto"},
        ],
    )
    fields.setdefault("summary", f"{app.name}: create an issue in acme/widgets")
    return ApprovalRequest.objects.create(
        session=session,
        app=app,
        app_name=app.name,
        method="POST",
        url="https://apps.test/repos/acme/widgets/issues?token=***",
        expires_at=timezone.now() + timedelta(minutes=5),
        **fields,
    )


@pytest.fixture
def ours(owner, org):
    return make_approval(
        owner,
        factories.make_app(org, name="FakeHub"),
        status=ApprovalRequest.Status.APPROVED,
        decided_via=ApprovalRequest.DecidedVia.USER,
        decided_by=owner,
        decided_at=timezone.now(),
    )


@pytest.fixture
def theirs(stranger):
    app = factories.make_app(stranger.membership.organization, name="GlobexTracker")
    return make_approval(stranger, app, summary="GlobexTracker: something secret")


@pytest.mark.django_db
def test_the_changelist_shows_who_which_app_what_and_the_outcome(client, org_admin, ours):
    long_summary = "FakeHub: " + "a very long summary " * 10
    make_approval(ours.session.owner, ours.app, summary=long_summary)
    client.force_login(org_admin)
    response = client.get(CHANGELIST)
    assert response.status_code == 200
    page = response.content.decode()
    for column in ["Created at", "Session owner", "App name", "Summary", "Status", "Decided via"]:
        assert column in page, column
    assert "owner@acme.test" in page
    assert "FakeHub: create an issue in acme/widgets" in page
    assert "The user, once" in page
    assert long_summary not in page  # cut short to keep the columns readable
    assert long_summary[:60] in page
    assert "https://apps.test/repos" not in page  # the URL is on the change page
    assert client.get(CHANGELIST + "?q=owner@acme").status_code == 200


@pytest.mark.django_db
def test_the_change_page_is_read_only_and_readable(client, org_admin, ours):
    client.force_login(org_admin)
    response = client.get(change_url(ours))
    assert response.status_code == 200
    page = response.content.decode()
    # The label, not "Url" anywhere: the page's random CSRF token may contain that.
    assert "<label>URL:</label>" in page and "<label>Url" not in page
    assert "Create an issue (ask), Read issues (auto-approve)" in page
    assert '"key"' not in page and "&quot;key&quot;" not in page  # no raw JSON
    assert "Fix the build" in page and str(ours.session.pk) in page
    assert "owner@acme.test" in page
    assert 'name="_save"' not in page
    assert client.post(change_url(ours), {"status": "rejected"}).status_code == 403
    ours.refresh_from_db()
    assert ours.status == "approved"


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["org_admin", "superuser"])
def test_organization_admins_see_only_their_organizations_requests(
    client, ours, theirs, persona, request
):
    client.force_login(request.getfixturevalue(persona))
    page = client.get(CHANGELIST).content.decode()
    assert "FakeHub" in page
    if persona == "superuser":
        assert "GlobexTracker" in page
        assert client.get(change_url(theirs)).status_code == 200
        return
    assert "GlobexTracker" not in page and "stranger@globex.test" not in page
    assert client.get(change_url(theirs)).status_code == 302  # "does not exist"
    assert client.get(change_url(ours)).status_code == 200


@pytest.mark.django_db
def test_members_cannot_open_the_approvals_admin(client, owner, ours):
    client.force_login(owner)
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
