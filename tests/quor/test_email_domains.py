"""Organizations claim email domains and prove them with a DNS TXT record (a fake DNS
server here); SCIM and single sign-on create users only in verified domains
(test_scim.py, test_sso_bad_tokens.py)."""

import pytest

from quor import email_domains
from quor.lib.errors import QuorError
from quor.models import AuditEntry, EmailDomain, Membership
from tests import factories
from tests.fakes import FakeDnsServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def dns(settings):
    server = FakeDnsServer("127.0.0.1", 0)
    settings.QUOR_DOMAIN_VERIFICATION_DNS_SERVER = f"127.0.0.1:{server.sock.getsockname()[1]}"
    yield server
    server.close()


def publish(dns, claim):
    dns.txt[claim.record_name] = [claim.record_value]


def test_a_claim_is_verified_by_its_dns_record_and_audited(dns, org):
    claim = email_domains.email_domain_claim(organization=org, domain=" Acme.Test ")
    assert (claim.domain, claim.verified_at) == ("acme.test", None)
    assert claim.record_name == "_quor-verification.acme.test"
    assert claim.token in claim.record_value

    with pytest.raises(QuorError) as refused:
        email_domains.email_domain_verify(claim=claim)
    assert refused.value.code == "email_domains.record_not_found"
    assert "_quor-verification.acme.test" in refused.value.message
    claim.refresh_from_db()
    assert claim.verified_at is None

    dns.txt[claim.record_name] = ["quor-verification=another-organizations-token"]
    with pytest.raises(QuorError):
        email_domains.email_domain_verify(claim=claim)

    publish(dns, claim)
    email_domains.email_domain_verify(claim=claim)
    claim.refresh_from_db()
    assert claim.verified_at is not None
    assert email_domains.domain_is_verified(org, "ada@ACME.test")
    assert not email_domains.domain_is_verified(org, "ada@sub.acme.test")
    actions = list(
        AuditEntry.objects.filter(organization=org, action__startswith="email_domain.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["email_domain.claimed", "email_domain.verified"]


@pytest.mark.parametrize(
    "domain", ["", "acme", "*.acme.test", "ada@acme.test", "https://acme.test", "a..test", 7]
)
def test_a_claim_that_is_no_domain_is_refused(org, domain):
    with pytest.raises(QuorError) as refused:
        email_domains.email_domain_claim(organization=org, domain=domain)
    assert refused.value.code == "email_domains.invalid_domain"
    assert not EmailDomain.objects.exists()


def test_an_organization_claims_a_domain_once(org):
    email_domains.email_domain_claim(organization=org, domain="acme.test")
    with pytest.raises(QuorError) as refused:
        email_domains.email_domain_claim(organization=org, domain="ACME.test")
    assert refused.value.code == "email_domains.exists"


def test_a_domain_is_held_by_at_most_one_organization(dns, org):
    """Another organization may claim it (a claim proves nothing, and must not let anyone
    keep the domain's holder out), but not verify it while it is held."""
    globex = factories.make_org(slug="globex")
    theirs = email_domains.email_domain_claim(organization=globex, domain="acme.test")
    ours = email_domains.email_domain_claim(organization=org, domain="acme.test")
    publish(dns, ours)
    email_domains.email_domain_verify(claim=ours)

    publish(dns, theirs)
    with pytest.raises(QuorError) as refused:
        email_domains.email_domain_verify(claim=theirs)
    assert refused.value.code == "email_domains.held_elsewhere"
    theirs.refresh_from_db()
    assert theirs.verified_at is None
    assert not email_domains.domain_is_verified(globex, "ada@acme.test")


def test_removing_a_domain_stops_creating_users_in_it_and_is_audited(org):
    claim = factories.make_verified_domain(org, "acme.test")
    email_domains.email_domain_remove(claim=claim)
    assert not email_domains.domain_is_verified(org, "ada@acme.test")
    entry = AuditEntry.objects.get(action="email_domain.removed")
    assert entry.changes == {"domain": "acme.test", "was_verified": True}


def test_an_owner_claims_and_verifies_in_the_admin(dns, client, org):
    owner = factories.make_user(org, role=Membership.Role.OWNER, email="boss@acme.test")
    client.force_login(owner)
    response = client.post(
        "/admin/quor/emaildomain/add/", {"organization": org.pk, "domain": "acme.test"}
    )
    assert response.status_code == 302, response.content.decode()
    claim = EmailDomain.objects.get(organization=org)
    page = client.get(f"/admin/quor/emaildomain/{claim.pk}/change/").content.decode()
    assert claim.record_value in page

    publish(dns, claim)
    response = client.post(
        "/admin/quor/emaildomain/",
        {"action": "verify_selected", "_selected_action": [claim.pk]},
        follow=True,
    )
    assert response.status_code == 200
    claim.refresh_from_db()
    assert claim.verified_at is not None


def test_an_admin_reads_the_claims_and_another_organization_sees_none(client, org):
    claim = factories.make_verified_domain(org, "acme.test")
    client.force_login(factories.make_user(org, role=Membership.Role.ADMIN, email="a@acme.test"))
    assert client.get(f"/admin/quor/emaildomain/{claim.pk}/change/").status_code == 200
    assert client.post("/admin/quor/emaildomain/add/", {"domain": "x.test"}).status_code == 403
    client.force_login(
        factories.make_user(
            factories.make_org(slug="globex"), role=Membership.Role.OWNER, email="o@globex.test"
        )
    )
    assert "acme.test" not in client.get("/admin/quor/emaildomain/").content.decode()
