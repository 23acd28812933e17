"""Sandbox and model access: one place, clear refusals."""

import pytest
from django.contrib.auth.models import Group

from quor.lib.errors import AccessDenied, InvalidInput
from quor.lib.permissions import check_model_access, check_sandbox_access
from quor.models import Membership
from tests import factories


@pytest.mark.django_db
def test_a_member_of_an_enabled_organization_may_use_sandbox(owner):
    assert check_sandbox_access(owner).organization.slug == "acme"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "code"),
    [
        ("org_disabled", "access.organization_disabled"),
        ("org_sandbox_off", "access.sandbox_disabled_for_organization"),
        ("member_no_sandbox", "access.sandbox_not_allowed"),
        ("no_membership", "access.no_organization"),
    ],
)
def test_sandbox_access_refusals_say_which_check_failed(owner, org, change, code):
    if change == "org_disabled":
        org.is_active = False
        org.save()
    elif change == "org_sandbox_off":
        org.sandbox_enabled = False
        org.save()
    elif change == "member_no_sandbox":
        Membership.objects.filter(user=owner).update(can_use_sandbox=False)
    else:
        Membership.objects.filter(user=owner).delete()
    owner.refresh_from_db()
    with pytest.raises(AccessDenied) as excinfo:
        check_sandbox_access(owner)
    assert excinfo.value.code == code
    assert excinfo.value.status == 403


@pytest.mark.django_db
def test_model_access_allows_models_shared_with_everyone(owner, org):
    provider = factories.make_provider(org, model_names=["m1", "m2"])
    choice = check_model_access(owner, f"{provider.pk}:m2")
    assert (choice.provider, choice.name) == (provider, "m2")


@pytest.mark.django_db
def test_model_access_follows_chosen_users_and_groups(owner, colleague, org):
    provider = factories.make_provider(org, available_to_everyone=False, allowed_users=[owner])
    model_id = f"{provider.pk}:claude-test"
    assert check_model_access(owner, model_id).provider == provider
    with pytest.raises(AccessDenied) as excinfo:
        check_model_access(colleague, model_id)
    assert excinfo.value.code == "access.model_not_allowed"

    group = Group.objects.create(name="analysts")
    colleague.groups.add(group)
    provider.allowed_groups.add(group)
    assert check_model_access(colleague, model_id).provider == provider


@pytest.mark.django_db
@pytest.mark.parametrize("model_id", ["nonsense", "999999:claude-test", "{pk}:not-listed", ""])
def test_unknown_models_are_refused_as_invalid_input(owner, org, model_id):
    provider = factories.make_provider(org)
    with pytest.raises(InvalidInput) as excinfo:
        check_model_access(owner, model_id.format(pk=provider.pk))
    assert excinfo.value.code == "models.unknown_model"


@pytest.mark.django_db
def test_another_organizations_model_is_unknown_not_forbidden(owner, stranger):
    foreign = factories.make_provider(stranger.membership.organization)
    with pytest.raises(InvalidInput):
        check_model_access(owner, f"{foreign.pk}:claude-test")


@pytest.mark.django_db
def test_models_endpoint_lists_only_the_models_the_member_may_use(
    client_for, owner, colleague, org
):
    shared = factories.make_provider(org, model_names=["shared-model"])
    factories.make_provider(
        org, model_names=["private-model"], available_to_everyone=False, allowed_users=[owner]
    )
    ids = lambda user: sorted(  # noqa: E731
        m["id"] for m in client_for(user).get("/api/v1/models/").json()["results"]
    )
    assert ids(colleague) == [f"{shared.pk}:shared-model"]
    assert len(ids(owner)) == 2


@pytest.mark.django_db
def test_members_of_a_disabled_organization_are_refused_by_the_api(client_for, owner, org):
    client = client_for(owner)
    org.is_active = False
    org.save()
    response = client.get("/api/v1/models/")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "access.organization_disabled"
