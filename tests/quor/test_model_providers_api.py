import pytest

from quor.models import ModelProvider
from tests import factories

NEW_PROVIDER = {
    "kind": "openai",
    "display_name": "OpenAI",
    "api_key": "sk-live-secret-value-0123456789",
    "model_names": ["gpt-test"],
}


@pytest.mark.django_db
def test_an_org_admin_creates_a_provider_and_the_key_is_never_returned(client_for, org_admin, org):
    client = client_for(org_admin)
    response = client.post("/api/v1/model-providers/", NEW_PROVIDER, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert "api_key" not in body
    assert body["has_api_key"] is True
    assert body["effective_base_url"] == "https://api.openai.com/v1"
    provider = ModelProvider.objects.get(pk=body["id"])
    assert provider.organization == org
    assert provider.api_key == NEW_PROVIDER["api_key"]

    for response in (
        client.get("/api/v1/model-providers/"),
        client.get(f"/api/v1/model-providers/{provider.pk}/"),
        client.patch(
            f"/api/v1/model-providers/{provider.pk}/", {"display_name": "O"}, format="json"
        ),
    ):
        assert response.status_code == 200
        assert NEW_PROVIDER["api_key"] not in response.content.decode()


@pytest.mark.django_db
def test_patching_without_a_key_keeps_the_stored_key(client_for, org_admin, org):
    provider = factories.make_provider(org, api_key="sk-keep-me")
    client = client_for(org_admin)
    response = client.patch(
        f"/api/v1/model-providers/{provider.pk}/", {"model_names": ["a", "b"]}, format="json"
    )
    assert response.status_code == 200
    provider.refresh_from_db()
    assert provider.api_key == "sk-keep-me"
    assert provider.model_names == ["a", "b"]


@pytest.mark.django_db
def test_members_cannot_manage_providers(client_for, owner):
    response = client_for(owner).post("/api/v1/model-providers/", NEW_PROVIDER, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "access.permission_required"
    assert not ModelProvider.objects.exists()


@pytest.mark.django_db
def test_an_admin_deletes_an_unused_provider_but_not_one_sessions_use(
    client_for, org_admin, owner, org
):
    unused = factories.make_provider(org)
    used = factories.make_provider(org)
    factories.make_session(owner, used)
    client = client_for(org_admin)
    assert client.delete(f"/api/v1/model-providers/{unused.pk}/").status_code == 204
    response = client.delete(f"/api/v1/model-providers/{used.pk}/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "model_providers.in_use"
    assert ModelProvider.objects.filter(pk=used.pk).exists()


@pytest.mark.django_db
def test_allowed_users_must_be_members_of_the_organization(client_for, org_admin, stranger):
    response = client_for(org_admin).post(
        "/api/v1/model-providers/",
        {**NEW_PROVIDER, "available_to_everyone": False, "allowed_users": [stranger.email]},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "model_providers.invalid_audience"
    assert not ModelProvider.objects.exists()
