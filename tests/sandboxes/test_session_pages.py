"""The session UI pages (server-rendered)."""

import pytest

from sandboxes.models import Session
from tests import factories


@pytest.mark.django_db
def test_the_session_list_offers_only_the_models_the_member_may_use(logged_in, org, owner):
    shared = factories.make_provider(org, display_name="Shared", model_names=["m-shared"])
    factories.make_provider(
        org, display_name="Private", model_names=["m-private"], available_to_everyone=False
    )
    page = logged_in.get("/").content.decode()
    assert f'value="{shared.pk}:m-shared"' in page
    assert "m-private" not in page
    assert "No sessions yet" in page


@pytest.mark.django_db(transaction=True)
def test_the_new_session_form_starts_a_session_and_opens_its_page(logged_in, org, queued):
    provider = factories.make_provider(org)
    response = logged_in.post(
        "/sessions/new", {"prompt": "Say hi", "model": f"{provider.pk}:claude-test"}
    )
    session = Session.objects.get()
    assert response["Location"] == f"/sessions/{session.pk}/"
    page = logged_in.get(response["Location"]).content.decode()
    assert "Say hi" in page
    assert f'data-session-id="{session.pk}"' in page
    assert queued == [str(session.pk)]


@pytest.mark.django_db
def test_a_bad_new_session_form_shows_the_reason_and_creates_nothing(logged_in, org):
    factories.make_provider(org)
    response = logged_in.post("/sessions/new", {"prompt": " ", "model": "1:x"}, follow=True)
    assert b"Unknown model" in response.content or b"empty" in response.content
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_other_peoples_session_pages_are_404(client, colleague, owner):
    session = factories.make_session(owner)
    client.force_login(colleague)
    assert client.get(f"/sessions/{session.pk}/").status_code == 404
    assert client.post(f"/sessions/{session.pk}/cancel").status_code == 404
    assert client.get("/sessions/not-a-uuid/").status_code == 404


@pytest.mark.django_db
def test_pages_need_login(client, owner):
    session = factories.make_session(owner)
    assert client.get(f"/sessions/{session.pk}/")["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
def test_cancel_and_follow_up_buttons_go_through_the_services(logged_in, owner, queued):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    logged_in.post(f"/sessions/{session.pk}/cancel")
    session.refresh_from_db()
    assert session.status == Session.Status.CANCELLED
    logged_in.post(f"/sessions/{session.pk}/follow-up", {"text": "try again"})
    session.refresh_from_db()
    assert session.status == Session.Status.PENDING


@pytest.mark.django_db
def test_pages_link_to_the_pages_not_to_the_api(logged_in, owner):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    listing = logged_in.get("/").content.decode()
    assert f'href="/sessions/{session.pk}/"' in listing
    page = logged_in.get(f"/sessions/{session.pk}/").content.decode()
    assert f'action="/sessions/{session.pk}/cancel"' in page
    assert f'action="/sessions/{session.pk}/follow-up"' in page
