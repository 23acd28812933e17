import pytest

from tests import factories


@pytest.mark.django_db
def test_the_login_page_asks_for_email_and_password(client):
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b'type="email"' in page.content
    assert b'type="password"' in page.content


@pytest.mark.django_db
def test_a_member_logs_in_with_email_and_sees_their_organization(client, owner):
    response = client.post(
        "/accounts/login/", {"username": owner.email, "password": factories.PASSWORD}
    )
    assert response.status_code == 302
    home = client.get("/")
    assert b"Acme" in home.content
    assert b"No sessions yet" in home.content


@pytest.mark.django_db
def test_a_wrong_password_is_refused(client, owner):
    response = client.post("/accounts/login/", {"username": owner.email, "password": "nope"})
    assert response.status_code == 200
    assert b"Please enter a correct" in response.content


@pytest.mark.django_db
def test_pages_need_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
def test_the_openapi_schema_and_docs_page_are_served(client):
    assert client.get("/api/schema/").status_code == 200
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower()
