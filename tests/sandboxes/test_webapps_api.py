"""Web apps in the API: the runtime registers them (sandbox credential), the owner lists
them and sets who may open them (sharing)."""

import pytest
from rest_framework.test import APIClient

from sandboxes.models import Sandbox, Session, hash_token
from sandboxes.sessions.services import agents_md
from tests import factories
from webapps.models import WebApp

RUNTIME_URL = "/api/v1/runtime/sessions/{}/webapps/"
SERVER = {"port": 8000, "command": "python3 -m http.server --bind 0.0.0.0 8000"}


def runtime_client(credential: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return client


@pytest.fixture
def session(owner):
    session = factories.make_session(owner, status=Session.Status.RUNNING)
    Sandbox.objects.filter(pk=session.sandbox_id).update(
        runtime_credential_hash=hash_token("cred-owner")
    )
    return session


@pytest.fixture
def runtime(session):
    """The runtime in the session's own sandbox."""
    return runtime_client("cred-owner")


@pytest.fixture
def webapp(session):
    from webapps.services import webapp_register

    return webapp_register(session=session, **SERVER)


def error_code(response):
    return response.status_code, response.json()["error"]["code"]


# --- the runtime registers --------------------------------------------------------------


@pytest.mark.django_db
def test_the_runtime_registers_a_web_app_and_tells_the_viewers(runtime, session):
    response = runtime.post(RUNTIME_URL.format(session.pk), SERVER, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    webapp = WebApp.objects.get()
    assert body == {
        "id": str(webapp.pk),
        "label": webapp.label,
        "port": 8000,
        "command": SERVER["command"],
        "status": "running",
        "url": body["url"],
        "open_url": f"/webapps/{webapp.label}/open",
        "view_url": f"/webapps/{webapp.label}/",
    }
    assert body["url"].startswith("http") and f"//{webapp.label}." in body["url"]
    assert webapp.session == session
    [event] = session.events.filter(kind="webapp_started")
    assert event.payload == {"webapp": body}


@pytest.mark.django_db
def test_registering_the_same_port_again_updates_the_web_app(runtime, session):
    url = RUNTIME_URL.format(session.pk)
    first = runtime.post(url, SERVER, format="json").json()
    WebApp.objects.update(status=WebApp.Status.STOPPED)

    again = runtime.post(url, {"port": 8000, "command": "node server.js"}, format="json")
    other = runtime.post(url, {"port": 8001, "command": "node api.js"}, format="json")

    assert again.status_code == 201 and other.status_code == 201
    assert again.json()["id"] == first["id"] and again.json()["label"] == first["label"]
    assert again.json()["command"] == "node server.js" and again.json()["status"] == "running"
    assert WebApp.objects.count() == 2
    assert WebApp.objects.get(port=8000).command == "node server.js"
    assert session.events.filter(kind="webapp_started").count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"port": 80, "command": "x"}, "webapps.invalid_port"),
        ({"port": 70000, "command": "x"}, "webapps.invalid_port"),
        ({"port": "8000", "command": "x"}, "webapps.invalid_port"),
        ({"port": True, "command": "x"}, "webapps.invalid_port"),
        ({"port": 8000.5, "command": "x"}, "webapps.invalid_port"),
        ({"port": 47100, "command": "x"}, "webapps.reserved_port"),  # the exec channel's
        ({"port": 8000, "command": ""}, "webapps.invalid_command"),
        ({"port": 8000, "command": "   "}, "webapps.invalid_command"),
        ({"port": 8000, "command": "x" * 2001}, "webapps.invalid_command"),
        ({"port": 8000, "command": ["python3"]}, "webapps.invalid_command"),
        ({"port": 8000}, "invalid_input"),
        ({"command": "x"}, "invalid_input"),
        ({**SERVER, "label": "wchosen"}, "invalid_input"),
        ([SERVER], "invalid_input"),
    ],
)
def test_bad_registrations_are_400_and_change_nothing(runtime, session, body, code):
    response = runtime.post(RUNTIME_URL.format(session.pk), body, format="json")

    assert error_code(response) == (400, code)
    assert not WebApp.objects.exists()
    assert not session.events.exists()


@pytest.mark.django_db
def test_only_the_sessions_own_sandbox_may_register(session, owner, colleague, client_for):
    other = factories.make_session(colleague, status=Session.Status.RUNNING)
    Sandbox.objects.filter(pk=other.sandbox_id).update(
        runtime_credential_hash=hash_token("cred-colleague")
    )
    url = RUNTIME_URL.format(session.pk)

    assert error_code(runtime_client("cred-colleague").post(url, SERVER, format="json")) == (
        404,
        "not_found",
    )
    assert runtime_client("cred-unknown").post(url, SERVER, format="json").status_code == 401
    assert APIClient().post(url, SERVER, format="json").status_code == 401
    # A user's API token is no sandbox credential, not even the owner's.
    assert client_for(owner).post(url, SERVER, format="json").status_code == 401
    own = runtime_client("cred-owner")
    assert own.post(RUNTIME_URL.format(other.pk), SERVER, format="json").status_code == 404
    assert own.post(RUNTIME_URL.format("not-a-uuid"), SERVER, format="json").status_code == 404
    assert not WebApp.objects.exists()


# --- the owner lists them ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_owner_lists_the_sessions_web_apps(client_for, owner, session, webapp):
    from webapps.services import webapp_payload

    factories.make_session(owner)  # another session of the owner, without web apps
    response = client_for(owner).get(f"/api/v1/sessions/{session.pk}/webapps/")

    assert response.status_code == 200
    assert response.json()["results"] == [webapp_payload(webapp)]


@pytest.mark.django_db
@pytest.mark.parametrize("sharing", ["private", "organization"])
def test_nobody_but_the_owner_lists_web_apps(
    client_for, session, webapp, colleague, stranger, org_admin, sharing
):
    """Sharing lets others open the apps, never list the session's apps."""
    Session.objects.filter(pk=session.pk).update(sharing=sharing)
    url = f"/api/v1/sessions/{session.pk}/webapps/"

    for user in (colleague, org_admin, stranger):
        assert error_code(client_for(user).get(url)) == (404, "not_found")
    assert APIClient().get(url).status_code == 401


# --- sharing ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_owner_shares_the_web_apps_with_the_organization_and_back(client_for, owner, session):
    api = client_for(owner)
    url = f"/api/v1/sessions/{session.pk}/"
    assert api.get(url).json()["sharing"] == "private"

    response = api.patch(url, {"sharing": "organization"}, format="json")
    assert response.status_code == 200
    assert response.json()["sharing"] == "organization"
    assert response.json()["id"] == str(session.pk)
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.ORGANIZATION

    assert api.patch(url, {"sharing": "private"}, format="json").json()["sharing"] == "private"
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.PRIVATE
    assert api.get("/api/v1/sessions/").json()["results"][0]["sharing"] == "private"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"sharing": "public"}, "webapps.invalid_sharing"),
        ({"sharing": ""}, "invalid_input"),
        ({}, "invalid_input"),
        ({"sharing": "organization", "title": " "}, "sessions.invalid_title"),
        ({"sharing": "organization", "owner": 3}, "invalid_input"),
    ],
)
def test_bad_sharing_changes_nothing(client_for, owner, session, body, code):
    response = client_for(owner).patch(f"/api/v1/sessions/{session.pk}/", body, format="json")

    assert error_code(response) == (400, code)
    session.refresh_from_db()
    assert (session.sharing, session.title) == (Session.Sharing.PRIVATE, "")


@pytest.mark.django_db
def test_nobody_but_the_owner_changes_sharing(client_for, session, colleague, stranger, org_admin):
    url = f"/api/v1/sessions/{session.pk}/"
    body = {"sharing": "organization"}

    for user in (colleague, org_admin, stranger):
        assert error_code(client_for(user).patch(url, body, format="json")) == (404, "not_found")
    assert APIClient().patch(url, body, format="json").status_code == 401
    assert client_for(session.owner).put(url, body, format="json").status_code == 405
    session.refresh_from_db()
    assert session.sharing == Session.Sharing.PRIVATE


@pytest.mark.django_db
def test_sharing_decides_who_may_open_the_web_app(client, session, webapp, colleague, stranger):
    """The switch the owner sets is what the hand-off on Quor's origin checks."""
    open_url = f"/webapps/{webapp.label}/open"
    client.force_login(colleague)
    assert client.get(open_url).status_code == 404

    Session.objects.filter(pk=session.pk).update(sharing=Session.Sharing.ORGANIZATION)
    assert client.get(open_url).status_code == 302
    client.force_login(stranger)
    assert client.get(open_url).status_code == 404


# --- the agent's instructions -----------------------------------------------------------


@pytest.mark.django_db
def test_agents_md_tells_the_agent_how_to_start_a_web_app(session):
    instructions = agents_md(session)

    assert "## Web apps" in instructions
    assert "`start_web_app`" in instructions and "0.0.0.0" in instructions  # noqa: S104
