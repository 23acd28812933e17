"""Every API endpoint: 401 without credentials, 404 for another user's object."""

import pytest

from tests import factories

LIST_ENDPOINTS = [
    "/api/v1/me/",
    "/api/v1/models/",
    "/api/v1/model-providers/",
    "/api/v1/tokens/",
    "/api/v1/sessions/",
    "/api/v1/sandbox/",
]


@pytest.fixture
def objects_of_owner(owner, org):
    """One object of each kind with a detail endpoint, owned by `owner` or their org."""
    provider = factories.make_provider(org)
    session = factories.make_session(owner, provider)
    from quor import services

    token, _ = services.api_token_create(user=owner, name="owner's token")
    return {
        "provider": f"/api/v1/model-providers/{provider.pk}/",
        "session": f"/api/v1/sessions/{session.pk}/",
        "token": f"/api/v1/tokens/{token.pk}/",
    }


@pytest.mark.django_db
@pytest.mark.parametrize("path", LIST_ENDPOINTS)
def test_unauthenticated_requests_get_401_with_the_error_format(api_client, path):
    response = api_client.get(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["provider", "session", "token"])
def test_unauthenticated_requests_to_objects_get_401(api_client, objects_of_owner, kind):
    assert api_client.get(objects_of_owner[kind]).status_code == 401
    assert api_client.delete(objects_of_owner[kind]).status_code == 401


@pytest.mark.django_db
def test_an_unknown_token_gets_401(api_client):
    api_client.credentials(HTTP_AUTHORIZATION="Bearer quor_pat_not-a-real-token")
    response = api_client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


@pytest.mark.django_db
def test_a_revoked_token_stops_working(api_client, owner):
    from quor import services

    token, raw = services.api_token_create(user=owner, name="ci")
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api_client.get("/api/v1/me/").status_code == 200
    services.api_token_revoke(user=owner, token_id=token.pk)
    assert api_client.get("/api/v1/me/").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["session", "token"])
def test_another_users_object_is_404_even_in_the_same_organization(
    client_for, colleague, objects_of_owner, kind
):
    client = client_for(colleague)
    assert client.get(objects_of_owner[kind]).status_code == 404
    if kind == "token":
        assert client.delete(objects_of_owner[kind]).status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["provider", "session", "token"])
def test_objects_of_another_organization_are_404(client_for, stranger, objects_of_owner, kind):
    from quor.models import Membership

    Membership.objects.filter(user=stranger).update(role=Membership.Role.ADMIN)
    client = client_for(stranger)
    response = client.get(objects_of_owner[kind])
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.django_db
def test_lists_show_only_the_requesting_users_objects(
    client_for, owner, colleague, objects_of_owner
):
    client = client_for(colleague)
    assert client.get("/api/v1/sessions/").json()["results"] == []
    token_names = [t["name"] for t in client.get("/api/v1/tokens/").json()["results"]]
    assert token_names == ["tests"]


@pytest.mark.django_db
def test_the_owner_sees_their_own_objects(client_for, owner, objects_of_owner):
    client = client_for(owner)
    assert client.get(objects_of_owner["session"]).status_code == 200
    assert len(client.get("/api/v1/sessions/").json()["results"]) == 1


@pytest.mark.django_db
def test_a_user_without_a_sandbox_gets_404_for_it(client_for, owner):
    response = client_for(owner).get("/api/v1/sandbox/")
    assert response.status_code == 404


@pytest.mark.django_db
def test_browser_session_login_authenticates_the_api(client, owner):
    assert client.login(username=owner.email, password=factories.PASSWORD)
    response = client.get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["email"] == owner.email
    assert response.json()["organization"] == "acme"


@pytest.mark.django_db
def test_unknown_api_paths_answer_404_in_the_error_format(api_client):
    response = api_client.get("/api/v1/nope/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
