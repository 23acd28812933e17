"""Bad input gets a 4xx that says what is wrong, and changes nothing."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from quor.models import ApiToken, ModelProvider
from sandboxes.models import Session

PROVIDERS = "/api/v1/model-providers/"


@pytest.fixture
def admin_client(client_for, org_admin):
    return client_for(org_admin)


@pytest.mark.django_db
def test_malformed_json_is_a_400_that_says_so(admin_client):
    response = admin_client.post(PROVIDERS, data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_request"
    assert "JSON" in response.json()["error"]["message"]
    assert not ModelProvider.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "openai", "display_name": "x", "model_names": "gpt"}, "model_names"),
        ({"kind": "bogus", "display_name": "x", "model_names": ["m"]}, "kind"),
        ({"kind": "openai", "display_name": ["x"], "model_names": ["m"]}, "display_name"),
        (
            {"kind": "openai", "display_name": "x", "model_names": ["m"], "base_url": "nope"},
            "base_url",
        ),
        ({"kind": "openai", "display_name": "x", "model_names": ["m"], "colour": "red"}, "colour"),
    ],
)
def test_wrong_types_and_unknown_fields_name_the_field(admin_client, body, field):
    response = admin_client.post(PROVIDERS, body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert field in error["fields"]
    assert not ModelProvider.objects.exists()


@pytest.mark.django_db
def test_a_json_array_instead_of_an_object_is_refused(admin_client):
    response = admin_client.post(PROVIDERS, [1, 2], format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_input"


@pytest.mark.django_db
@override_settings(QUOR_MAX_REQUEST_BYTES=1000)
def test_oversize_bodies_get_413_before_being_read(client_for, owner):
    response = client_for(owner).post("/api/v1/tokens/", {"name": "x" * 2000}, format="json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert not ApiToken.objects.filter(name__startswith="xxx").exists()


@pytest.mark.django_db
@override_settings(QUOR_MAX_UPLOAD_BYTES=1000)
def test_an_oversize_upload_from_a_page_gets_a_page_that_says_so(client, owner):
    client.force_login(owner)
    upload = SimpleUploadedFile("big.bin", b"x" * 5000)
    response = client.post("/sessions/new", {"prompt": "Hi", "attachments": upload})
    assert response.status_code == 413
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "What you sent is too large" in page
    assert "at most 1000\xa0bytes" in page
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_an_unsupported_media_type_is_a_415(admin_client):
    response = admin_client.post(PROVIDERS, data="kind=openai", content_type="text/plain")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.django_db
def test_a_wrong_method_is_a_405(client_for, owner):
    response = client_for(owner).put("/api/v1/models/", {}, format="json")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.django_db
def test_an_empty_token_name_is_refused(client_for, owner):
    response = client_for(owner).post("/api/v1/tokens/", {"name": "  "}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["name"]
    assert ApiToken.objects.filter(user=owner).count() == 1  # only the client's own token


@pytest.mark.django_db
def test_an_unexpected_api_error_is_a_500_in_the_error_format(client_for, owner, monkeypatch):
    from quor import selectors

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(selectors, "models_available_to", broken)
    client = client_for(owner)
    client.raise_request_exception = False
    response = client.get("/api/v1/models/")
    assert response.status_code == 500
    assert response.json() == {
        "error": {"code": "server_error", "message": "Something went wrong on our side."}
    }
