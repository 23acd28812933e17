"""SCIM provisioning as Quor uses it: an identity provider's connector creates, finds,
deactivates and deletes people and groups of its own organization only, and bad input
changes nothing. The protocol itself is checked by test_scim_compliance.py."""

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from rest_framework.test import APIClient

from quor import email_domains, service_accounts
from quor.models import ApiToken, AuditEntry, EmailDomain, Membership, OrganizationGroup, User
from quor.selectors import model_provider_is_available_to
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


def scim_client(organization, scopes=("scim",)) -> APIClient:
    account = service_accounts.service_account_create(
        organization=organization, name="Identity provider", scopes=list(scopes)
    )
    _, raw_token = service_accounts.service_account_token_create(account=account)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
    client.account = account
    return client


@pytest.fixture
def idp(org):
    factories.make_verified_domain(org, "acme.test")
    return scim_client(org)


def create_user(idp, user_name, **attributes):
    body = {"schemas": [USER_SCHEMA], "userName": user_name, **attributes}
    return idp.post("/scim/v2/Users", body, format="json")


def patch(idp, path, *operations):
    body = {"schemas": [PATCH_SCHEMA], "Operations": list(operations)}
    return idp.patch(path, body, format="json")


def test_a_provisioned_user_is_a_member_without_a_password(idp, org):
    response = create_user(
        idp, "Ada@Acme.test", displayName="Ada Lovelace", externalId="00u1", active=True
    )
    assert response.status_code == 201, response.json()
    assert response["Content-Type"] == "application/scim+json"
    body = response.json()
    assert body["userName"] == "ada@acme.test"
    assert response["Location"].endswith(f"/scim/v2/Users/{body['id']}")
    assert body["id"].startswith("user:")
    user = User.objects.get(pk=body["id"].removeprefix("user:"))
    assert (user.full_name, user.membership.organization, user.membership.role) == (
        "Ada Lovelace",
        org,
        Membership.Role.MEMBER,
    )
    assert user.membership.external_id == "00u1"
    assert not user.has_usable_password()
    entry = AuditEntry.objects.get(action="member.added")
    assert entry.actor == idp.account.user


def test_the_name_fills_in_for_a_missing_display_name(idp):
    response = create_user(idp, "bob@acme.test", name={"givenName": "Bob", "familyName": "Ray"})
    assert response.json()["displayName"] == "Bob Ray"


def test_a_filter_finds_a_user_by_user_name_whatever_its_case(idp, owner):
    create_user(idp, "ada@acme.test")
    response = idp.get("/scim/v2/Users", {"filter": 'userName eq "ADA@acme.test"'})
    assert response.status_code == 200
    body = response.json()
    assert body["totalResults"] == 1
    assert body["Resources"][0]["userName"] == "ada@acme.test"


def test_pages_are_counted_from_one(idp, owner, colleague):
    everyone = idp.get("/scim/v2/Users").json()
    assert everyone["totalResults"] == 2  # people: the service account is not listed
    second = idp.get("/scim/v2/Users", {"startIndex": 2, "count": 1}).json()
    assert (second["startIndex"], second["itemsPerPage"]) == (2, 1)
    assert second["Resources"][0]["id"] == everyone["Resources"][1]["id"]


@pytest.mark.parametrize(
    ("query", "scim_type"),
    [
        ('userName eq "x', "invalidFilter"),
        ("shoeSize gt 42", "invalidFilter"),
        ('userName zz "x"', "invalidFilter"),
    ],
)
def test_a_malformed_filter_is_a_clear_error(idp, query, scim_type):
    response = idp.get("/scim/v2/Users", {"filter": query})
    assert response.status_code == 400
    body = response.json()
    assert body["scimType"] == scim_type
    assert body["schemas"] == ["urn:ietf:params:scim:api:messages:2.0:Error"]


@pytest.mark.parametrize(
    "attributes",
    [
        {"shoeSize": 42},
        {"urn:example:params:scim:schemas:extension:2.0:Shoes": {"size": 42}},
        {"active": "maybe"},
    ],
)
def test_unknown_or_malformed_attributes_create_nothing(idp, attributes):
    response = create_user(idp, "ada@acme.test", **attributes)
    assert response.status_code == 400
    assert response.json()["scimType"] in ("invalidSyntax", "invalidValue")
    assert not User.objects.filter(email="ada@acme.test").exists()


def test_a_user_name_that_is_not_an_email_address_is_refused(idp):
    response = create_user(idp, "ada")
    assert response.status_code == 400
    assert response.json()["scimType"] == "invalidValue"
    assert "email address" in response.json()["detail"]


def test_a_user_name_taken_in_the_organization_is_a_uniqueness_conflict(idp, colleague):
    response = create_user(idp, colleague.email)
    assert response.status_code == 409
    assert response.json()["scimType"] == "uniqueness"


def test_an_address_taken_in_another_organization_reads_as_one_that_does_not_exist(idp, stranger):
    """What the connector learns never depends on another organization's people: both
    addresses are in a domain its organization has not verified."""
    taken = create_user(idp, stranger.email)
    free = create_user(idp, "nobody@globex.test")
    assert (taken.status_code, taken.json()) == (free.status_code, free.json())
    assert taken.status_code == 400
    stranger.refresh_from_db()
    assert stranger.membership.organization.slug == "globex"
    assert not User.objects.filter(email="nobody@globex.test").exists()


def test_users_are_created_only_in_the_organizations_verified_domains(idp, org):
    response = create_user(idp, "ada@initech.test")
    assert response.status_code == 400
    assert response.json()["scimType"] == "invalidValue"
    assert "initech.test" in response.json()["detail"]
    claim = email_domains.email_domain_claim(organization=org, domain="initech.test")
    assert create_user(idp, "ada@initech.test").status_code == 400  # claimed, not verified
    assert not User.objects.filter(email="ada@initech.test").exists()
    EmailDomain.objects.filter(pk=claim.pk).update(verified_at=timezone.now())
    assert create_user(idp, "ada@initech.test").status_code == 201


def test_a_user_is_not_renamed_into_a_domain_the_organization_has_not_verified(idp, owner):
    response = idp.put(
        f"/scim/v2/Users/{owner.pk}",
        {"schemas": [USER_SCHEMA], "userName": "owner@globex.test", "active": True},
        format="json",
    )
    assert response.status_code == 400
    owner.refresh_from_db()
    assert owner.email == "owner@acme.test"
    # A member whose address is outside the verified domains keeps it through a PUT.
    outside = factories.make_user(owner.membership.organization, email="old@elsewhere.test")
    response = idp.put(
        f"/scim/v2/Users/user:{outside.pk}",
        {"schemas": [USER_SCHEMA], "userName": outside.email, "displayName": "Old", "active": True},
        format="json",
    )
    assert response.status_code == 200, response.json()


def test_no_two_resources_share_an_id_whatever_their_type(idp, org, owner):
    """RFC 7643 §3.1: an id is unique across all the provider's resources. A group whose
    database key is the owner's: its SCIM id is still not the owner's."""
    OrganizationGroup.objects.create(
        organization=org,
        group=Group.objects.create(pk=owner.pk, name="acme: Everyone"),
        display_name="Everyone",
    )
    everything = idp.post("/scim/v2/.search", {}, format="json").json()["Resources"]
    ids = {resource["id"] for resource in everything}
    assert len(everything) == len(ids) == 2
    user_id = next(r["id"] for r in everything if r.get("userName") == owner.email)
    group_id = next(r["id"] for r in everything if r.get("displayName") == "Everyone")
    assert idp.get(f"/scim/v2/Groups/{user_id}").status_code == 404
    assert idp.get(f"/scim/v2/Users/{group_id}").status_code == 404
    assert idp.get(f"/scim/v2/Users/{user_id}").json()["userName"] == owner.email


def test_a_connector_that_kept_the_earlier_bare_numbers_still_finds_its_resources(idp, org, owner):
    group = idp.post(
        "/scim/v2/Groups", {"schemas": [GROUP_SCHEMA], "displayName": "Ops"}, format="json"
    ).json()
    number = group["id"].removeprefix("group:")
    response = patch(
        idp,
        f"/scim/v2/Groups/{number}",
        {"op": "add", "path": "members", "value": [{"value": str(owner.pk)}]},
    )
    assert response.status_code == 200, response.json()
    assert response.json()["members"][0]["value"] == f"user:{owner.pk}"
    assert idp.get(f"/scim/v2/Users/{owner.pk}").json()["id"] == f"user:{owner.pk}"


def test_deactivating_through_scim_ends_the_users_access(idp, owner, client_for):
    api = client_for(owner)
    response = patch(
        idp, f"/scim/v2/Users/{owner.pk}", {"op": "replace", "path": "active", "value": False}
    )
    assert response.status_code == 200, response.json()
    assert response.json()["active"] is False
    assert api.get("/api/v1/sessions/").status_code == 401
    assert not ApiToken.objects.filter(user=owner, revoked_at__isnull=True).exists()
    entry = AuditEntry.objects.get(action="user.deactivated")
    assert (entry.actor, entry.changes["via"]) == (idp.account.user, "scim")


def test_active_cannot_be_removed(idp, owner):
    response = patch(idp, f"/scim/v2/Users/{owner.pk}", {"op": "remove", "path": "active"})
    assert response.status_code == 400
    assert response.json()["scimType"] == "mutability"
    owner.refresh_from_db()
    assert owner.is_active


def test_deleting_through_scim_removes_the_user(idp, owner):
    assert idp.delete(f"/scim/v2/Users/{owner.pk}").status_code == 204
    assert not User.objects.filter(pk=owner.pk).exists()
    assert idp.get(f"/scim/v2/Users/{owner.pk}").status_code == 404
    assert list(
        AuditEntry.objects.filter(action__startswith="user.").values_list("action", flat=True)
    ) == ["user.deleted", "user.deactivated"]


def test_a_connector_sees_and_touches_only_its_own_organization(idp, stranger):
    assert idp.get(f"/scim/v2/Users/{stranger.pk}").status_code == 404
    response = patch(
        idp, f"/scim/v2/Users/{stranger.pk}", {"op": "replace", "path": "active", "value": False}
    )
    assert response.status_code == 404
    assert idp.delete(f"/scim/v2/Users/{stranger.pk}").status_code == 404
    stranger.refresh_from_db()
    assert stranger.is_active
    assert stranger.email not in str(idp.get("/scim/v2/Users").json())


def test_groups_decide_model_access(idp, org, owner, colleague):
    provider = factories.make_provider(org, available_to_everyone=False)
    response = idp.post(
        "/scim/v2/Groups",
        {"schemas": [GROUP_SCHEMA], "displayName": "Engineering", "members": [{"value": str(owner.pk)}]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.json()
    group = OrganizationGroup.objects.get(organization=org, display_name="Engineering").group
    provider.allowed_groups.add(group)
    assert model_provider_is_available_to(provider, owner)
    assert not model_provider_is_available_to(provider, colleague)

    path = f"/scim/v2/Groups/{group.pk}"
    response = patch(
        idp, path,
        {"op": "add", "path": "members", "value": [{"value": str(colleague.pk)}]},
        {"op": "remove", "path": f'members[value eq "{owner.pk}"]'},
    )  # fmt: skip
    assert response.status_code == 200, response.json()
    assert [m["value"] for m in response.json()["members"]] == [f"user:{colleague.pk}"]
    assert not model_provider_is_available_to(provider, owner)
    assert model_provider_is_available_to(provider, colleague)
    assert idp.get(f"/scim/v2/Users/{colleague.pk}").json()["groups"][0]["display"] == "Engineering"

    assert idp.delete(path).status_code == 204
    assert not model_provider_is_available_to(provider, colleague)
    actions = set(AuditEntry.objects.values_list("action", flat=True))
    assert {"group.added", "group.changed", "group.deleted"} <= actions


def test_a_group_takes_only_its_organizations_users(idp, owner, stranger):
    response = idp.post(
        "/scim/v2/Groups",
        {"schemas": [GROUP_SCHEMA], "displayName": "Mixed",
         "members": [{"value": str(owner.pk)}, {"value": str(stranger.pk)}]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json()["scimType"] == "invalidValue"
    assert not OrganizationGroup.objects.exists()


def test_only_a_live_token_with_the_scim_scope_opens_scim(org, owner, client_for):
    without_scope = scim_client(org, scopes=("sessions",))
    assert without_scope.get("/scim/v2/Users").status_code == 401
    assert client_for(owner).get("/scim/v2/Users").status_code == 401
    idp = scim_client(factories.make_org(name="Initech", slug="initech"))
    response = idp.get("/scim/v2/Users")
    assert response.status_code == 200
    assert idp.get("/api/v1/sessions/").status_code == 403  # scim opens nothing else
    service_accounts.service_account_disable(account=idp.account)
    response = idp.get("/scim/v2/Users")
    assert response.status_code == 401
    assert response.json()["schemas"] == ["urn:ietf:params:scim:api:messages:2.0:Error"]
    assert response["WWW-Authenticate"] == "Bearer"


def test_a_connector_over_its_rate_limit_is_told_when_to_come_back(idp, settings):
    settings.QUOR_API_RATE_LIMIT_PER_TOKEN = 2
    assert [idp.get("/scim/v2/Users").status_code for _ in range(2)] == [200, 200]
    response = idp.get("/scim/v2/Users")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert response.json()["schemas"] == ["urn:ietf:params:scim:api:messages:2.0:Error"]


def test_what_entra_sends_is_understood(idp, owner, colleague):
    """Entra's default mappings: the enterprise extension, capitalised operations,
    booleans as strings, emails Quor does not keep, members removed by value."""
    response = create_user(
        idp,
        "dee@acme.test",
        schemas=[USER_SCHEMA, "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"],
        emails=[{"primary": True, "type": "work", "value": "dee@acme.io"}],
        **{"urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"department": "R&D"}},
    )
    assert response.status_code == 201, response.json()
    dee = response.json()["id"]
    response = patch(
        idp, f"/scim/v2/Users/{dee}",
        {"op": "Replace", "path": 'emails[type eq "work"].value', "value": "dee@acme.io"},
        {"op": "Add", "path": "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User:department", "value": "Ops"},
        {"op": "Replace", "path": "active", "value": "False"},
    )  # fmt: skip
    assert response.status_code == 200, response.json()
    assert response.json()["active"] is False
    assert not User.objects.get(pk=dee.removeprefix("user:")).is_active

    group = idp.post(
        "/scim/v2/Groups",
        {"schemas": [GROUP_SCHEMA], "displayName": "Ops",
         "members": [{"value": str(owner.pk)}, {"value": str(colleague.pk)}]},
        format="json",
    ).json()  # fmt: skip
    response = patch(
        idp,
        f"/scim/v2/Groups/{group['id']}",
        {"op": "Remove", "path": "members", "value": [{"$ref": None, "value": str(owner.pk)}]},
    )
    assert response.status_code == 200, response.json()
    assert [m["value"] for m in response.json()["members"]] == [f"user:{colleague.pk}"]


def test_a_put_without_active_lets_no_deactivated_user_back_in(idp, owner):
    patch(idp, f"/scim/v2/Users/{owner.pk}", {"op": "replace", "path": "active", "value": False})
    response = idp.put(
        f"/scim/v2/Users/{owner.pk}",
        {"schemas": [USER_SCHEMA], "userName": owner.email, "displayName": "Owner"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["active"] is False
    owner.refresh_from_db()
    assert not owner.is_active


@pytest.mark.parametrize("user_id", ["²", "1" * 40, "-1", "x"])
def test_an_id_that_is_not_a_number_is_no_user(idp, user_id):
    response = idp.get(f"/scim/v2/Users/{user_id}")
    assert response.status_code == 404
    assert response.json()["status"] == "404"


def test_a_root_search_with_a_value_of_the_wrong_type_is_an_invalid_filter(idp, owner):
    response = idp.post("/scim/v2/.search", {"filter": 'active eq "x"'}, format="json")
    assert response.status_code == 400
    assert response.json()["scimType"] == "invalidFilter"


def test_a_plain_json_client_gets_json(idp, owner):
    response = idp.get("/scim/v2/Users", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"


def test_only_an_owner_gives_the_scim_scope(org, org_admin, client_for):
    admin, owner = (
        client_for(org_admin),
        client_for(factories.make_user(org, role=Membership.Role.OWNER)),
    )
    body = {"name": "Okta", "scopes": ["scim"]}
    response = admin.post("/api/v1/service-accounts/", body, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "access.owner_required"
    response = owner.post("/api/v1/service-accounts/", body, format="json")
    assert response.status_code == 201
    account_id = response.json()["id"]
    tokens = f"/api/v1/service-accounts/{account_id}/tokens/"
    assert admin.post(tokens, {}, format="json").status_code == 403
    assert owner.post(tokens, {}, format="json").status_code == 201


def test_a_disabled_organizations_connector_is_refused(idp, org, owner):
    org.is_active = False
    org.save()
    assert idp.get("/scim/v2/Users").status_code == 401
    assert (
        patch(
            idp, f"/scim/v2/Users/{owner.pk}", {"op": "replace", "path": "active", "value": False}
        ).status_code
        == 401
    )
