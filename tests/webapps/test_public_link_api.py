"""Public links through the API, from where the owner, a colleague and a stranger stand:
off unless the organization allows them, never for a confidential session, an expiry
that is required and bounded, and an audit of their making and revoking. (The visitors'
side, through the real web app proxy processes: test_public_links.py.)"""

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from quor.models import AuditEntry, Organization
from sandboxes.models import Session
from tests import factories
from webapps import services as webapps
from webapps.models import PublicLink, WebApp

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"


@pytest.fixture
def app_of_owner(owner, org):
    Organization.objects.filter(pk=org.pk).update(allow_public_links=True)
    session = factories.make_session(owner)
    return WebApp.objects.create(session=session, port=8080, command="python3 app.py")


def _create(client, webapp, **fields):
    body = {
        "webapp": str(webapp.pk),
        "expires_at": (timezone.now() + timedelta(days=1)).isoformat(),
        **fields,
    }
    return client.post(f"/api/v1/sessions/{webapp.session_id}/public-links/", body, format="json")


def test_the_owner_makes_a_link_with_its_own_origin_and_it_is_audited(
    client_for, owner, app_of_owner
):
    response = _create(client_for(owner), app_of_owner, requests_per_minute=5)
    assert response.status_code == 201, response.content
    link = PublicLink.objects.get(pk=response.json()["id"])
    assert response.json()["url"] == webapps.app_origin().origin(link.label) + "/"
    assert link.label != app_of_owner.label and len(link.label) == 33
    assert link.requests_per_minute == 5
    entry = AuditEntry.objects.get(action="public_link.created")
    assert entry.actor == owner and entry.target_id == str(link.pk)
    listed = client_for(owner).get(f"/api/v1/sessions/{app_of_owner.session_id}/public-links/")
    assert [item["id"] for item in listed.json()["results"]] == [str(link.pk)]


def test_no_link_unless_the_organization_allows_them(client_for, owner, org, app_of_owner):
    Organization.objects.filter(pk=org.pk).update(allow_public_links=False)
    response = _create(client_for(owner), app_of_owner)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "webapps.public_links_not_allowed"
    assert not PublicLink.objects.exists()


def test_no_link_for_a_confidential_session(client_for, owner, app_of_owner):
    Session.objects.filter(pk=app_of_owner.session_id).update(confidential=True)
    response = _create(client_for(owner), app_of_owner)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "webapps.session_confidential"
    assert not PublicLink.objects.exists()


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"expires_at": "2020-01-01T00:00:00Z"}, "webapps.invalid_link_expiry"),
        ({"expires_at": (timezone.now() + timedelta(days=31)).isoformat()}, "webapps.invalid_link_expiry"),
        ({"visitor_auth": "password", "password": "short"}, "webapps.invalid_link_password"),
        ({"visitor_auth": "password"}, "webapps.invalid_link_password"),
        ({"password": "a password for nothing"}, "webapps.invalid_link_password"),
    ],
)  # fmt: skip
def test_an_expiry_is_bounded_and_a_password_link_needs_a_password(
    client_for, owner, app_of_owner, fields, code
):
    response = _create(client_for(owner), app_of_owner, **fields)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


@pytest.mark.parametrize("who", ["colleague", "stranger", "org_admin"])
def test_only_the_owner_sees_makes_or_revokes_links(client_for, request, owner, app_of_owner, who):
    link = PublicLink.objects.get(pk=_create(client_for(owner), app_of_owner).json()["id"])
    other = client_for(request.getfixturevalue(who))
    assert _create(other, app_of_owner).status_code == 404
    assert other.get(f"/api/v1/public-links/{link.pk}/").status_code == 404
    assert other.get(f"/api/v1/public-links/{link.pk}/visits/").status_code == 404
    assert other.delete(f"/api/v1/public-links/{link.pk}/").status_code == 404
    link.refresh_from_db()
    assert link.revoked_at is None


def test_a_revoked_link_is_gone_and_its_revocation_audited(client_for, owner, app_of_owner):
    client = client_for(owner)
    link_id = _create(client, app_of_owner).json()["id"]
    assert client.delete(f"/api/v1/public-links/{link_id}/").status_code == 204
    assert client.get(f"/api/v1/public-links/{link_id}/").status_code == 404
    assert client.delete(f"/api/v1/public-links/{link_id}/").status_code == 404
    assert AuditEntry.objects.filter(action="public_link.revoked", target_id=link_id).count() == 1
    listed = client.get(f"/api/v1/sessions/{app_of_owner.session_id}/public-links/")
    assert listed.json()["results"] == []


def test_the_session_page_makes_and_revokes_links_for_its_owner_only(
    owner, colleague, app_of_owner
):
    page = Client()
    page.force_login(owner)
    session_url = f"/sessions/{app_of_owner.session_id}/"
    made = page.post(
        f"{session_url}public-links",
        {"webapp": str(app_of_owner.pk), "days": "3", "password": PASSWORD},
    )
    assert made.status_code == 302
    link = PublicLink.objects.get()
    assert link.visitor_auth == "password" and link.password_hash != PASSWORD
    assert timedelta(days=2, hours=23) < link.expires_at - timezone.now() <= timedelta(days=3)
    assert link.label in page.get(session_url).content.decode()

    intruder = Client()
    intruder.force_login(colleague)
    revoke_url = f"{session_url}public-links/{link.pk}/revoke"
    assert intruder.post(revoke_url).status_code == 404
    assert (
        intruder.post(f"{session_url}public-links", {"webapp": str(app_of_owner.pk)}).status_code
        == 404
    )
    assert page.post(revoke_url).status_code == 302
    link.refresh_from_db()
    assert link.revoked_at is not None


def test_a_link_is_revoked_only_through_its_own_sessions_page(owner, client_for, app_of_owner):
    link_id = _create(client_for(owner), app_of_owner).json()["id"]
    other_session = factories.make_session(owner)
    page = Client()
    page.force_login(owner)
    elsewhere = f"/sessions/{other_session.pk}/public-links/{link_id}/revoke"
    unknown = f"/sessions/{app_of_owner.session_id}/public-links/{uuid.uuid4()}/revoke"
    assert page.post(elsewhere).status_code == 404
    assert page.post(unknown).status_code == 404
    assert PublicLink.objects.get(pk=link_id).revoked_at is None


def test_an_organization_admin_switches_links_and_marks_sessions_confidential(
    org_admin, org, app_of_owner
):
    admin_site = Client()
    admin_site.force_login(org_admin)
    policy = admin_site.post(f"/admin/webapps/publiclinkpolicy/{org.pk}/change/", {})
    assert policy.status_code == 302
    org.refresh_from_db()
    assert org.allow_public_links is False
    marked = admin_site.post(
        f"/admin/webapps/sessionconfidentiality/{app_of_owner.session_id}/change/",
        {"confidential": "on"},
    )
    assert marked.status_code == 302
    assert Session.objects.get(pk=app_of_owner.session_id).confidential
    changes = dict(AuditEntry.objects.values_list("action", "actor"))
    assert changes["organization.public_links_changed"] == org_admin.pk
    assert changes["session.confidential_changed"] == org_admin.pk


def test_a_member_cannot_switch_links_on(owner, org):
    Organization.objects.filter(pk=org.pk).update(allow_public_links=False)
    admin_site = Client()
    admin_site.force_login(owner)
    admin_site.post(
        f"/admin/webapps/publiclinkpolicy/{org.pk}/change/", {"allow_public_links": "on"}
    )
    org.refresh_from_db()
    assert org.allow_public_links is False


def test_the_owner_makes_a_link_for_people_of_email_domains(client_for, owner, app_of_owner):
    response = _create(
        client_for(owner),
        app_of_owner,
        visitor_auth="email",
        email_domains=["example.com", "b.example.org", "example.com"],
    )
    assert response.status_code == 201, response.content
    assert response.json()["email_domains"] == ["b.example.org", "example.com"]
    link = PublicLink.objects.get()
    assert link.visitor_auth == "email" and link.password_hash == ""
    entry = AuditEntry.objects.get(action="public_link.created")
    assert entry.changes["email_domains"] == ["b.example.org", "example.com"]


@pytest.mark.parametrize(
    "fields",
    [
        {"visitor_auth": "email"},
        {"visitor_auth": "email", "email_domains": []},
        {"visitor_auth": "email", "email_domains": ["Example.com"]},
        {"visitor_auth": "email", "email_domains": ["*.example.com"]},
        {"visitor_auth": "email", "email_domains": ["localhost"]},
        {"visitor_auth": "email", "email_domains": ["https://example.com"]},
        {"visitor_auth": "email", "email_domains": ["someone@example.com"]},
        {"visitor_auth": "email", "email_domains": ["example..com"]},
        {"visitor_auth": "email", "email_domains": [42]},
        {"visitor_auth": "email", "email_domains": "example.com"},
        {"visitor_auth": "email", "email_domains": [f"d{n}.example.com" for n in range(21)]},
        {"visitor_auth": "email", "email_domains": ["example.com"], "password": PASSWORD},
        {"email_domains": ["example.com"]},
        {"visitor_auth": "password", "password": PASSWORD, "email_domains": ["example.com"]},
    ],
)
def test_a_bad_list_of_email_domains_is_refused_and_makes_nothing(
    client_for, owner, app_of_owner, fields
):
    response = _create(client_for(owner), app_of_owner, **fields)
    assert response.status_code == 400, response.content
    assert not PublicLink.objects.exists()


def test_no_email_link_where_no_mail_can_be_sent(client_for, owner, app_of_owner, settings):
    settings.EMAIL_HOST = ""
    response = _create(
        client_for(owner), app_of_owner, visitor_auth="email", email_domains=["example.com"]
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "webapps.email_not_configured"
    assert not PublicLink.objects.exists()


def test_the_session_page_makes_a_link_for_email_domains(owner, app_of_owner):
    page = Client()
    page.force_login(owner)
    session_url = f"/sessions/{app_of_owner.session_id}/"
    assert b'name="email_domains"' in page.get(session_url).content
    made = page.post(
        f"{session_url}public-links",
        {"webapp": str(app_of_owner.pk), "days": "3", "email_domains": "Example.com, acme.test"},
    )
    assert made.status_code == 302
    link = PublicLink.objects.get()
    assert link.visitor_auth == "email" and link.email_domains == ["acme.test", "example.com"]
    assert "email at acme.test, example.com" in page.get(session_url).content.decode()


@pytest.mark.parametrize(
    ("typed", "address"),
    [
        (" Visitor@Example.COM ", "visitor@example.com"),
        ("a@bücher.de", "a@xn--bcher-kva.de"),
        ("not an address", None),
        ("a@example.com\r\nBcc: b@example.com", None),
    ],
)
def test_a_visitors_address_is_compared_lowercase_with_its_domain_in_xn_form(typed, address):
    assert webapps.visitor_email(typed) == address
