import pytest
from django.contrib import admin
from django.urls import reverse

from quor.models import ModelProvider
from tests import factories


@pytest.fixture
def populated(owner, org, stranger):
    provider = factories.make_provider(org, api_key="sk-admin-secret-do-not-show")
    session = factories.make_session(owner, provider, title="Quarterly report")
    factories.make_event(session, 1, text="hello")
    from quor import services

    services.api_token_create(user=owner, name="laptop")
    return provider


def all_changelist_urls():
    return [
        reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for model in admin.site._registry
    ]


@pytest.mark.django_db
def test_every_admin_changelist_renders_with_data_search_and_filters(client, superuser, populated):
    client.force_login(superuser)
    urls = all_changelist_urls()
    assert len(urls) >= 9
    for url in urls:
        assert client.get(url).status_code == 200, url
        assert client.get(url, {"q": "acme"}).status_code == 200, url


@pytest.mark.django_db
def test_every_admin_add_and_change_page_renders(client, superuser, populated):
    client.force_login(superuser)
    for model, model_admin in admin.site._registry.items():
        name = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        obj = model.objects.first()
        if obj is not None:
            assert client.get(reverse(f"{name}_change", args=[obj.pk])).status_code == 200, name
        if model_admin.has_add_permission(type("R", (), {"user": superuser})()):
            assert client.get(reverse(f"{name}_add")).status_code == 200, name


@pytest.mark.django_db
def test_the_provider_key_is_write_only_in_the_admin(client, superuser, populated):
    client.force_login(superuser)
    page = client.get(reverse("admin:quor_modelprovider_change", args=[populated.pk]))
    assert b"sk-admin-secret-do-not-show" not in page.content
    assert b"A key is stored" in page.content


@pytest.mark.django_db
def test_saving_the_provider_form_with_an_empty_key_keeps_the_key(client, superuser, populated):
    client.force_login(superuser)
    response = client.post(
        reverse("admin:quor_modelprovider_change", args=[populated.pk]),
        {
            "organization": populated.organization_id,
            "kind": "anthropic",
            "display_name": "Renamed",
            "base_url": "",
            "api_key": "",
            "model_names": "claude-a\nclaude-b\n",
            "available_to_everyone": "on",
        },
    )
    assert response.status_code == 302, response.content
    populated.refresh_from_db()
    assert populated.display_name == "Renamed"
    assert populated.api_key == "sk-admin-secret-do-not-show"
    assert populated.model_names == ["claude-a", "claude-b"]


@pytest.mark.django_db
def test_an_org_admin_sees_only_their_organizations_providers(
    client, org_admin, populated, stranger
):
    foreign = factories.make_provider(stranger.membership.organization, display_name="Foreign")
    client.force_login(org_admin)
    page = client.get(reverse("admin:quor_modelprovider_changelist"))
    assert page.status_code == 200
    assert populated.display_name.encode() in page.content
    assert b"Foreign" not in page.content
    assert b"Globex" not in page.content  # not even in the list filters
    assert (
        client.get(reverse("admin:quor_modelprovider_change", args=[foreign.pk])).status_code == 302
    )
    assert client.get(reverse("admin:sandboxes_session_changelist")).status_code == 403


@pytest.mark.django_db
def test_an_org_admin_adds_a_provider_to_their_own_organization_only(
    client, org_admin, org, stranger
):
    client.force_login(org_admin)
    form = {
        "kind": "openai",
        "display_name": "Mine",
        "base_url": "",
        "api_key": "sk-x",
        "model_names": "gpt-test",
        "available_to_everyone": "on",
    }
    foreign_org = stranger.membership.organization.pk
    client.post(reverse("admin:quor_modelprovider_add"), {**form, "organization": foreign_org})
    assert not ModelProvider.objects.filter(organization_id=foreign_org).exists()
    response = client.post(
        reverse("admin:quor_modelprovider_add"), {**form, "organization": org.pk}
    )
    assert response.status_code == 302
    assert ModelProvider.objects.get(display_name="Mine").organization == org


@pytest.mark.django_db
def test_members_who_are_not_staff_cannot_open_the_admin(client, owner):
    client.force_login(owner)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def _user_change_form(user, **changes):
    """The admin's change form of a user as a browser posts it, with `changes`."""
    form = {
        "email": user.email,
        "full_name": user.full_name,
        "is_active": "on" if user.is_active else "",
        "is_staff": "on" if user.is_staff else "",
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
        "last_login_0": "",
        "last_login_1": "",
        **changes,
    }
    return {key: value for key, value in form.items() if value != "" or key.startswith("last")}


@pytest.mark.django_db
def test_unticking_active_in_the_admin_deactivates_the_user_everywhere_and_ticking_it_reactivates(
    client, superuser, owner
):
    from quor import services
    from quor.models import ApiToken, AuditEntry

    services.api_token_create(user=owner, name="laptop")
    client.force_login(superuser)
    change = reverse("admin:quor_user_change", args=[owner.pk])

    response = client.post(change, _user_change_form(owner, is_active=""))
    assert response.status_code == 302, response.content
    owner.refresh_from_db()
    assert not owner.is_active
    assert not ApiToken.objects.filter(user=owner, revoked_at__isnull=True).exists()
    deactivated = AuditEntry.objects.get(action="user.deactivated", target_id=str(owner.pk))
    assert deactivated.changes["via"] == "admin"
    assert deactivated.actor == superuser

    response = client.post(change, _user_change_form(owner, is_active="on"))
    assert response.status_code == 302, response.content
    owner.refresh_from_db()
    assert owner.is_active
    assert AuditEntry.objects.filter(action="user.reactivated", target_id=str(owner.pk)).exists()


@pytest.mark.django_db
def test_saving_a_user_without_changing_active_records_no_deactivation(client, superuser, owner):
    from quor.models import AuditEntry

    client.force_login(superuser)
    change = reverse("admin:quor_user_change", args=[owner.pk])
    response = client.post(change, _user_change_form(owner, full_name="Renamed Owner"))
    assert response.status_code == 302, response.content
    owner.refresh_from_db()
    assert (owner.full_name, owner.is_active) == ("Renamed Owner", True)
    assert not AuditEntry.objects.filter(action__startswith="user.").exists()


@pytest.mark.django_db
def test_deleting_users_from_the_admin_list_deletes_each_through_the_service(
    client, superuser, owner, colleague
):
    from quor.models import AuditEntry, User

    client.force_login(superuser)
    response = client.post(
        reverse("admin:quor_user_changelist"),
        {"action": "delete_selected", "_selected_action": [owner.pk, colleague.pk], "post": "yes"},
    )
    assert response.status_code == 302, response.content
    assert not User.objects.filter(pk__in=[owner.pk, colleague.pk]).exists()
    deleted = AuditEntry.objects.filter(action="user.deleted").values_list("target_id", flat=True)
    assert sorted(deleted) == sorted([str(owner.pk), str(colleague.pk)])
