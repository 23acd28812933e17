"""Single sign-on against a certified OpenID Provider (panva's oidc-provider, from npm,
on loopback: tests/oidc_provider/): the sign-in a browser makes, driven here through
Quor's pages with Django's test client and through the provider's own forms with
HTTP; tests/ui/test_sso_sign_in.py makes the same trip in a real browser."""

from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
from django.contrib.auth.models import Group

from quor.models import AuditEntry, Membership, OrganizationGroup, SingleSignOn, User
from quor.sso import SIGNED_IN_KEY
from tests import factories
from tests.oidc_provider import quor_link_to_provider


@pytest.fixture
def organization_owner(org):
    return factories.make_user(org, role=Membership.Role.OWNER, email="boss@acme.test")


@pytest.fixture
def finance_group(org):
    return OrganizationGroup.objects.create(
        organization=org,
        group=Group.objects.create(name="acme: Finance"),
        display_name="Finance",
    )


def sign_in(client, provider, login: str, next_path: str = "/"):
    """Quor's sign-in as a browser makes it: Quor's redirect to the provider, the
    provider's login and consent forms, the provider's redirect back to Quor."""
    start = client.post("/accounts/sso/", {"organization": "acme", "next": next_path})
    back_to_quor = urlsplit(provider.authorize(quor_link_to_provider(start), login))
    assert back_to_quor.path == "/accounts/sso/callback/", back_to_quor
    return client.get(back_to_quor.path, parse_qs(back_to_quor.query))


def signed_in_user(client):
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id) if user_id else None


def organization_groups(user) -> set[str]:
    return {
        group.organization_group.display_name
        for group in user.groups.filter(organization_group__isnull=False)
    }


def test_someone_new_becomes_a_member_with_the_role_and_groups_their_claims_give(
    client,
    sso,
    openid_provider,
):
    openid_provider.set_accounts(
        {
            "alice": {
                "email": "Alice@Acme.test",
                "email_verified": True,
                "name": "Alice Liddell",
                "groups": ["Finance", "Everyone"],
                "quor_role": "auditor",
            }
        }
    )

    response = sign_in(client, openid_provider, "alice", next_path="/knowledge/")

    assert response.status_code == 302
    assert response["Location"] == "/knowledge/"
    user = signed_in_user(client)
    assert user.email == "alice@acme.test"
    assert user.full_name == "Alice Liddell"
    assert not user.has_usable_password()
    assert user.membership.organization == sso.organization
    assert user.membership.role == Membership.Role.AUDITOR
    assert organization_groups(user) == {"Finance", "Everyone"}
    assert AuditEntry.objects.filter(action="sso.user_created", actor=user).exists()
    login = AuditEntry.objects.get(action="sso.login", actor=user)
    assert login.changes["groups_added"] == ["Everyone", "Finance"]


def test_a_later_sign_in_follows_the_claims_as_they_change(
    client,
    sso,
    openid_provider,
    colleague,
    stranger,
    finance_group,
):
    colleague.groups.add(finance_group.group, Group.objects.create(name="not an organization's"))
    openid_provider.set_accounts(
        {
            "colleague": {
                "email_verified": True,
                "email": colleague.email,
                "groups": ["Sales"],
                "quor_role": "admin",
            }
        }
    )

    assert sign_in(client, openid_provider, "colleague").status_code == 302

    colleague.refresh_from_db()
    assert signed_in_user(client) == colleague
    assert colleague.membership.role == Membership.Role.ADMIN
    assert organization_groups(colleague) == {"Sales"}
    assert colleague.groups.filter(name="not an organization's").exists()
    entry = AuditEntry.objects.get(action="sso.login", actor=colleague)
    assert entry.changes["role"] == ["member", "admin"]
    assert entry.changes["groups_removed"] == ["Finance"]


def test_no_claim_makes_or_unmakes_an_owner(
    client,
    sso,
    openid_provider,
    organization_owner,
    colleague,
):
    openid_provider.set_accounts(
        {
            "boss": {
                "email_verified": True,
                "email": organization_owner.email,
                "quor_role": "member",
            },
            "colleague": {"email_verified": True, "email": colleague.email, "quor_role": "owner"},
        }
    )

    assert sign_in(client, openid_provider, "boss").status_code == 302
    client.logout()
    assert sign_in(client, openid_provider, "colleague").status_code == 302

    organization_owner.membership.refresh_from_db()
    assert organization_owner.membership.role == Membership.Role.OWNER
    colleague.membership.refresh_from_db()
    assert colleague.membership.role == Membership.Role.MEMBER


def test_a_groups_claim_left_out_leaves_the_groups_alone(
    client, sso, openid_provider, colleague, finance_group
):
    colleague.groups.add(finance_group.group)
    openid_provider.set_accounts({"colleague": {"email_verified": True, "email": colleague.email}})

    assert sign_in(client, openid_provider, "colleague").status_code == 302

    assert organization_groups(colleague) == {"Finance"}


def assert_refused_without_changes(client, response, reason, status=403):
    assert response.status_code == status, response.content
    assert f'data-reason="{reason}"' in response.content.decode()
    assert signed_in_user(client) is None
    assert AuditEntry.objects.filter(action="sso.refused", changes__reason=reason).exists()


def test_someone_unknown_is_refused_where_sign_in_creates_no_members(
    client,
    sso,
    openid_provider,
):
    sso.creates_users = False
    sso.save()
    openid_provider.set_accounts(
        {"eve": {"email_verified": True, "email": "eve@acme.test", "groups": ["Finance"]}}
    )

    response = sign_in(client, openid_provider, "eve")

    assert_refused_without_changes(client, response, "no_account")
    assert "eve@acme.test is not a member of Acme" in response.content.decode()
    assert not User.objects.filter(email="eve@acme.test").exists()
    assert not OrganizationGroup.objects.exists()


def test_a_deactivated_member_cannot_sign_in(client, sso, openid_provider, colleague):
    colleague.is_active = False
    colleague.save()
    openid_provider.set_accounts(
        {
            "colleague": {
                "email_verified": True,
                "email": colleague.email,
                "quor_role": "admin",
                "groups": ["Finance"],
            }
        }
    )

    response = sign_in(client, openid_provider, "colleague")

    assert_refused_without_changes(client, response, "deactivated")
    colleague.membership.refresh_from_db()
    assert colleague.membership.role == Membership.Role.MEMBER
    assert not OrganizationGroup.objects.exists()


def test_a_member_of_another_organization_cannot_sign_in_here(
    client,
    sso,
    openid_provider,
    stranger,
):
    openid_provider.set_accounts({"stranger": {"email_verified": True, "email": stranger.email}})

    response = sign_in(client, openid_provider, "stranger")

    assert_refused_without_changes(client, response, "no_account")
    stranger.membership.refresh_from_db()
    assert stranger.membership.organization.slug == "globex"


def test_with_password_login_off_a_member_must_use_single_sign_on_and_an_owner_need_not(
    client, sso, colleague, organization_owner
):
    sso.password_login = False
    sso.save()

    refused = client.post(
        "/accounts/login/", {"username": colleague.email, "password": factories.PASSWORD}
    )
    wrong = client.post("/accounts/login/", {"username": colleague.email, "password": "wrong"})

    assert refused.status_code == wrong.status_code == 200
    assert refused.context["form"].non_field_errors() == wrong.context["form"].non_field_errors()
    assert signed_in_user(client) is None

    allowed = client.post(
        "/accounts/login/", {"username": organization_owner.email, "password": factories.PASSWORD}
    )
    assert allowed.status_code == 302
    assert signed_in_user(client) == organization_owner


def test_logging_out_ends_the_providers_session_too(
    client,
    sso,
    openid_provider,
    colleague,
):
    openid_provider.set_accounts({"colleague": {"email_verified": True, "email": colleague.email}})
    assert sign_in(client, openid_provider, "colleague").status_code == 302

    response = client.post("/accounts/logout/")

    assert signed_in_user(client) is None
    provider_logout = quor_link_to_provider(response)
    end_session = urlsplit(provider_logout)
    discovery = requests.get(
        f"{openid_provider.issuer}/.well-known/openid-configuration", timeout=10
    ).json()
    assert provider_logout.startswith(discovery["end_session_endpoint"])
    query = parse_qs(end_session.query)
    assert query["post_logout_redirect_uri"] == ["http://testserver/accounts/login/"]
    assert query["id_token_hint"]
    assert openid_provider.end_session(provider_logout).startswith(
        "http://testserver/accounts/login/"
    )


def test_logging_out_after_a_password_login_stays_in_quor(client, sso, colleague):
    client.force_login(colleague)

    response = client.post("/accounts/logout/")

    assert response["Location"] == "http://testserver/accounts/login/"
    assert signed_in_user(client) is None


def test_keys_the_provider_rotated_are_fetched_at_the_next_sign_in(
    client,
    sso,
    openid_provider,
    colleague,
):
    openid_provider.set_accounts({"colleague": {"email_verified": True, "email": colleague.email}})
    assert sign_in(client, openid_provider, "colleague").status_code == 302
    client.logout()

    openid_provider.rotate_keys()

    assert sign_in(client, openid_provider, "colleague").status_code == 302
    assert signed_in_user(client) == colleague


@pytest.mark.django_db(transaction=True)
def test_a_sign_out_at_the_provider_ends_the_quor_session_through_the_back_channel(
    client, sso, openid_provider, colleague
):
    """The provider's server calls the real web process, which ends the session this
    browser signed in with."""
    openid_provider.set_accounts({"colleague": {"email_verified": True, "email": colleague.email}})
    assert sign_in(client, openid_provider, "colleague").status_code == 302
    signed_in = client.session[SIGNED_IN_KEY]
    assert signed_in["sid"]
    discovery = requests.get(
        f"{openid_provider.issuer}/.well-known/openid-configuration", timeout=10
    ).json()

    openid_provider.end_session(
        f"{discovery['end_session_endpoint']}?"
        + urlencode({"id_token_hint": signed_in["id_token"], "client_id": sso.client_id})
    )

    assert client.get("/account/tokens/").status_code == 302
    entry = AuditEntry.objects.get(action="sso.logout")
    assert entry.changes == {"issuer": sso.issuer, "sid": signed_in["sid"], "sessions_ended": 1}


@pytest.mark.parametrize("role", [Membership.Role.ADMIN, Membership.Role.AUDITOR])
def test_who_may_only_read_the_configuration_never_sees_the_client_secret(client, org, role):
    sso = SingleSignOn.objects.create(
        organization=org,
        issuer="https://login.acme.test",
        client_id="quor",
        client_secret="the-client-secret-nobody-reads",
    )
    provider = factories.make_provider(org)
    client.force_login(factories.make_user(org, role=role, email="reader@acme.test"))

    sso_page = client.get(f"/admin/quor/singlesignon/{sso.pk}/change/")
    provider_page = client.get(f"/admin/quor/modelprovider/{provider.pk}/change/")

    assert sso_page.status_code == provider_page.status_code == 200
    assert "login.acme.test" in sso_page.content.decode()
    assert "the-client-secret-nobody-reads" not in sso_page.content.decode()
    assert provider.api_key not in provider_page.content.decode()


def test_only_an_owner_configures_single_sign_on(client, org):
    """The role claim gives the admin role: configuring it is giving roles."""
    form = {
        "organization": org.pk,
        "enabled": "on",
        "issuer": "https://login.acme.test",
        "client_id": "quor",
        "client_secret": "a-secret",
        "scopes": "openid email",
        "email_claim": "email",
        "require_verified_email": "on",
        "password_login": "on",
    }
    client.force_login(factories.make_user(org, role=Membership.Role.ADMIN, email="a@acme.test"))
    assert client.post("/admin/quor/singlesignon/add/", form).status_code == 403
    assert not SingleSignOn.objects.exists()

    client.force_login(factories.make_user(org, role=Membership.Role.OWNER, email="o@acme.test"))
    refused = client.post(
        "/admin/quor/singlesignon/add/", {**form, "issuer": "http://login.acme.test"}
    )
    assert refused.status_code == 200
    assert "must be an https:// address" in refused.content.decode()
    assert client.post("/admin/quor/singlesignon/add/", form).status_code == 302
    assert SingleSignOn.objects.get().client_secret == "a-secret"
