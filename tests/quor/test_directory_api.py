"""The organization's members and groups through the REST API: read-only, the caller's
organization only, in pages, with the ids knowledge access lists take."""

import pytest
from django.contrib.auth.models import Group

from knowledge import services as knowledge_services
from quor import service_accounts
from quor.models import Membership, OrganizationGroup
from tests import factories

pytestmark = pytest.mark.django_db


def organization_group(organization, name):
    return OrganizationGroup.objects.create(
        organization=organization,
        group=Group.objects.create(name=f"{organization.slug}: {name}"),
        display_name=name,
    )


def everything(client, path):
    """Every item of a list, following `next`."""
    items, url = [], path
    while url:
        body = client.get(url).json()
        items += body["results"]
        url = body["next"]
    return items


def test_an_admin_lists_the_organizations_members_and_no_one_else(
    client_for, org_admin, owner, colleague, stranger
):
    members = everything(client_for(org_admin), "/api/v1/members/?page_size=1")
    assert sorted(m["email"] for m in members) == sorted(
        [org_admin.email, owner.email, colleague.email]
    )
    ada = next(m for m in members if m["email"] == colleague.email)
    assert ada["id"] == colleague.pk
    assert ada["principal"] == f"user:{colleague.pk}"
    assert (ada["role"], ada["is_active"], ada["is_service_account"]) == ("member", True, False)


def test_a_service_account_is_listed_as_one(client_for, org, org_admin):
    account = service_accounts.service_account_create(
        organization=org, name="CI", scopes=["sessions"]
    )
    members = everything(client_for(org_admin), "/api/v1/members/")
    robot = next(m for m in members if m["id"] == account.user_id)
    assert robot["is_service_account"] is True


def test_an_admin_lists_the_organizations_groups_and_no_others(client_for, org, org_admin):
    finance = organization_group(org, "Finance")
    finance.group.user_set.add(org_admin)
    organization_group(factories.make_org(slug="globex"), "Board")
    groups = everything(client_for(org_admin), "/api/v1/groups/")
    assert groups == [
        {
            "id": finance.group_id,
            "principal": f"group:{finance.group_id}",
            "display_name": "Finance",
            "external_id": "",
            "members": [org_admin.pk],
            "created_at": groups[0]["created_at"],
        }
    ]


def test_the_listed_ids_are_what_an_access_list_takes(client_for, org, org_admin, colleague):
    organization_group(org, "Legal")
    client = client_for(org_admin)
    principals = [m["principal"] for m in everything(client, "/api/v1/members/")]
    principals += [g["principal"] for g in everything(client, "/api/v1/groups/")]
    assert knowledge_services.validate_access(org, principals) == sorted(principals)


@pytest.mark.parametrize(
    ("role", "status"),
    [
        (Membership.Role.OWNER, 200),
        (Membership.Role.ADMIN, 200),
        (Membership.Role.AUDITOR, 200),
        (Membership.Role.MEMBER, 403),
    ],
)
def test_who_may_read_the_organizations_configuration_lists_them(client_for, org, role, status):
    client = client_for(factories.make_user(org, role=role))
    assert client.get("/api/v1/members/").status_code == status
    assert client.get("/api/v1/groups/").status_code == status


def test_the_lists_are_read_only(client_for, org_admin):
    client = client_for(org_admin)
    assert client.post("/api/v1/members/", {}, format="json").status_code == 405
    assert client.post("/api/v1/groups/", {}, format="json").status_code == 405
