"""The API tokens page: create (the value shown once), list and revoke."""

import pytest

from quor import services
from quor.models import ApiToken


@pytest.fixture
def logged_in(client, owner):
    client.force_login(owner)
    return client


@pytest.mark.django_db
def test_a_token_made_on_the_page_is_shown_once_and_works(logged_in, owner, api_client):
    response = logged_in.post("/account/tokens/", {"name": " laptop "})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    value = response.context["created"]["value"]
    assert f'value="{value}"' in response.content.decode()
    token = ApiToken.objects.get(user=owner)
    assert token.name == "laptop" and value.startswith(token.prefix)

    later = logged_in.get("/account/tokens/").content.decode()
    assert value not in later
    assert f"{token.prefix}…" in later
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    assert api_client.get("/api/v1/me/").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["", "   ", "n" * 101])
def test_a_bad_name_is_refused_and_creates_nothing(logged_in, name):
    response = logged_in.post("/account/tokens/", {"name": name})
    assert response.status_code == 400
    assert "A token needs a name of 1 to 100 characters." in response.content.decode()
    assert response.context["created"] is None
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_revoking_from_the_page_and_only_ones_own(logged_in, owner, colleague):
    mine, _ = services.api_token_create(user=owner, name="ci")
    theirs, _ = services.api_token_create(user=colleague, name="theirs")
    assert logged_in.post(f"/account/tokens/{theirs.pk}/revoke").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert logged_in.get(f"/account/tokens/{mine.pk}/revoke").status_code == 405

    response = logged_in.post(f"/account/tokens/{mine.pk}/revoke")
    assert response["Location"] == "/account/tokens/"
    mine.refresh_from_db()
    assert mine.revoked_at is not None
    page = logged_in.get("/account/tokens/").content.decode()
    assert f'action="/account/tokens/{mine.pk}/revoke"' not in page
    assert "Revoked" in page


@pytest.mark.django_db
def test_the_page_needs_login(client):
    assert client.get("/account/tokens/")["Location"].startswith("/accounts/login/")
    assert client.post("/account/tokens/", {"name": "x"}).status_code == 302
    assert not ApiToken.objects.exists()
