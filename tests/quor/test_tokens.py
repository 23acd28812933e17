import pytest
from rest_framework.test import APIClient

from quor.models import ApiToken


@pytest.mark.django_db
def test_a_new_token_is_shown_once_and_only_its_hash_is_stored(client_for, owner):
    client = client_for(owner)
    response = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert response.status_code == 201
    raw = response.json()["token"]
    assert raw.startswith("quor_pat_")
    stored = ApiToken.objects.get(pk=response.json()["id"])
    assert raw not in (stored.token_hash, stored.prefix)
    assert raw.startswith(stored.prefix)
    listed = client.get("/api/v1/tokens/").content.decode()
    assert raw not in listed

    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert fresh.get("/api/v1/me/").json()["email"] == owner.email


@pytest.mark.django_db
def test_revoking_a_token_through_the_api_makes_it_401(client_for, owner):
    client = client_for(owner)
    created = client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    assert client.delete(f"/api/v1/tokens/{created['id']}/").status_code == 204
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {created['token']}")
    assert fresh.get("/api/v1/me/").status_code == 401


@pytest.mark.django_db
def test_a_revoked_token_is_gone_from_the_api(client_for, owner):
    """DELETE revokes: the token is then 404, out of the list, and a second DELETE is 404
    (docs/decisions.md, 2026-12-04). The tokens page keeps showing it as revoked."""
    client = client_for(owner)
    created = client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    url = f"/api/v1/tokens/{created['id']}/"
    assert client.get(url).status_code == 200
    assert client.delete(url).status_code == 204
    assert client.get(url).json()["error"]["code"] == "not_found"
    assert client.delete(url).status_code == 404
    listed = [token["id"] for token in client.get("/api/v1/tokens/").json()["results"]]
    assert created["id"] not in listed
    assert ApiToken.objects.get(pk=created["id"]).revoked_at is not None
