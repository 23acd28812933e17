"""The Apps API for each persona: owner (a member), colleague, organization admin,
stranger (another organization) and anonymous. Secrets never come back."""

import pytest

from apps import services
from apps.models import App, AppCredential
from tests.apps.conftest import SECRET

APPS = "/api/v1/apps/"
CATALOG = "/api/v1/apps/catalog/"


def app_url(app):
    return f"{APPS}{app.pk}/"


def action_url(app, key):
    return f"{APPS}{app.pk}/actions/{key}/"


def credential_url(app):
    return f"{APPS}{app.pk}/credential/"


@pytest.fixture
def hidden(org):
    return services.app_create_custom(
        organization=org, name="Hidden", url_patterns=["https://h.test"], enabled=False
    )


def error_code(response):
    return response.json()["error"]["code"]


# --- anonymous -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_anonymous_requests_are_401_everywhere(api_client, github):
    for method, url in [
        ("get", APPS),
        ("get", CATALOG),
        ("get", app_url(github)),
        ("post", APPS),
        ("patch", app_url(github)),
        ("patch", action_url(github, "search")),
        ("put", credential_url(github)),
        ("delete", credential_url(github)),
    ]:
        response = getattr(api_client, method)(url, {}, format="json")
        assert response.status_code == 401, (method, url)
        assert error_code(response) == "not_authenticated"


# --- members ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_member_lists_the_enabled_apps_with_actions_and_policies(
    client_for, owner, github, hidden
):
    response = client_for(owner).get(APPS)
    assert response.status_code == 200
    (app,) = response.json()["results"]
    assert app["id"] == github.pk
    assert app["catalog_key"] == "github" and app["custom"] is False
    assert app["agent_env"] == "GH_TOKEN"
    actions = {a["key"]: a for a in app["actions"]}
    assert actions["delete_repository"]["policy"] == "deny"
    assert actions["read_contents"]["methods"] == ["GET"]
    assert app["has_organization_credential"] is False
    assert app["has_my_credential"] is False


@pytest.mark.django_db
def test_a_member_reads_the_catalog_with_what_is_already_added(client_for, owner, github):
    response = client_for(owner).get(CATALOG)
    assert response.status_code == 200
    entries = {e["key"]: e for e in response.json()["results"]}
    assert set(entries) == {"github", "slack", "jira", "notion"}
    assert entries["github"]["app_id"] == github.pk
    assert entries["slack"]["app_id"] is None
    merge = next(a for a in entries["github"]["actions"] if a["key"] == "merge_pull_request")
    assert merge["default_policy"] == "ask"
    assert entries["jira"]["credential_style"] == "basic"


@pytest.mark.django_db
def test_a_member_cannot_see_a_disabled_app(client_for, owner, hidden):
    api = client_for(owner)
    assert api.get(app_url(hidden)).status_code == 404
    response = api.put(credential_url(hidden), {"secret": "t"}, format="json")
    assert response.status_code == 404


@pytest.mark.django_db
def test_a_member_connects_and_disconnects_their_own_token(client_for, owner, colleague, github):
    api = client_for(owner)
    response = api.put(credential_url(github), {"secret": SECRET}, format="json")
    assert response.status_code == 200
    assert response.json()["has_my_credential"] is True
    assert response.json()["has_organization_credential"] is False
    assert AppCredential.objects.get(app=github, user=owner).secret == SECRET

    (seen_by_colleague,) = client_for(colleague).get(APPS).json()["results"]
    assert seen_by_colleague["has_my_credential"] is False

    assert api.delete(credential_url(github)).status_code == 204
    assert not AppCredential.objects.filter(app=github, user=owner).exists()
    assert api.delete(credential_url(github), {"scope": "user"}, format="json").status_code == 204


@pytest.mark.django_db
def test_a_bad_token_is_a_400_with_a_code_and_stores_nothing(client_for, owner, org):
    jira = services.app_enable_builtin(organization=org, catalog_key="jira")
    response = client_for(owner).put(credential_url(jira), {"secret": "no-colon"}, format="json")
    assert response.status_code == 400
    assert error_code(response) == "apps.invalid_secret"
    assert not AppCredential.objects.exists()


@pytest.mark.django_db
def test_a_member_cannot_do_what_only_organization_admins_do(client_for, owner, github):
    api = client_for(owner)
    attempts = [
        api.post(APPS, {"catalog_key": "slack"}, format="json"),
        api.patch(app_url(github), {"enabled": False}, format="json"),
        api.patch(action_url(github, "delete_repository"), {"policy": "auto"}, format="json"),
        api.put(credential_url(github), {"scope": "organization", "secret": "t"}, format="json"),
        api.delete(f"{credential_url(github)}?scope=organization"),
    ]
    for response in attempts:
        assert response.status_code == 403
        assert error_code(response) == "access.permission_required"
    github.refresh_from_db()
    assert github.enabled
    assert github.actions.get(key="delete_repository").policy == "deny"
    assert not App.objects.filter(catalog_key="slack").exists()
    assert not AppCredential.objects.exists()


# --- organization admins ------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_admin_sees_disabled_apps_too(client_for, org_admin, github, hidden):
    names = [a["name"] for a in client_for(org_admin).get(APPS).json()["results"]]
    assert names == ["GitHub", "Hidden"]
    assert client_for(org_admin).get(app_url(hidden)).status_code == 200


@pytest.mark.django_db
def test_an_admin_adds_a_built_in_app_from_the_catalog(client_for, org_admin, org):
    response = client_for(org_admin).post(
        APPS,
        {"catalog_key": "jira", "url_patterns": ["https://acme.atlassian.net"]},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "Jira"
    assert body["url_patterns"] == ["https://acme.atlassian.net"]
    assert {a["key"]: a["policy"] for a in body["actions"]}["delete_project"] == "deny"
    assert App.objects.get(pk=body["id"]).organization == org


@pytest.mark.django_db
def test_an_admin_adds_a_custom_app(client_for, org_admin):
    response = client_for(org_admin).post(
        APPS,
        {
            "name": "Billing",
            "url_patterns": ["https://billing.example.com/api"],
            "credential_style": "header",
            "credential_header": "X-Api-Key",
            "when_not_selected": "deny",
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["custom"] is True and body["actions"] == []
    assert body["credential_header"] == "x-api-key"
    assert body["when_not_selected"] == "deny"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"catalog_key": "myspace"}, 400, "apps.unknown_catalog_app"),
        ({"catalog_key": "github"}, 409, "apps.exists"),
        ({"name": "GitHub", "url_patterns": ["https://x.test"]}, 409, "apps.name_taken"),
        ({"name": "X", "url_patterns": ["x.test"]}, 400, "apps.invalid_url_pattern"),
        ({"name": "X"}, 400, "invalid_input"),
        ({"name": "X", "url_patterns": ["https://x.test"], "colour": "red"}, 400, "invalid_input"),
        (
            {"name": "X", "url_patterns": ["https://x.test"], "credential_style": "header"},
            400,
            "apps.invalid_credential_header",
        ),
    ],
)
def test_an_admin_adding_a_bad_app_gets_a_clear_error_and_nothing_is_added(
    client_for, org_admin, github, body, status, code
):
    response = client_for(org_admin).post(APPS, body, format="json")
    assert response.status_code == status
    assert error_code(response) == code
    assert App.objects.count() == 1


@pytest.mark.django_db
def test_an_admin_changes_an_app_and_an_action_policy(client_for, org_admin, github):
    api = client_for(org_admin)
    changes = {"enabled": False, "url_patterns": ["https://git.acme.test/api/v3"]}
    response = api.patch(app_url(github), changes, format="json")
    assert response.status_code == 200
    assert response.json()["enabled"] is False

    response = api.patch(
        action_url(github, "merge_pull_request"), {"policy": "deny"}, format="json"
    )
    assert response.status_code == 200
    assert (response.json()["key"], response.json()["policy"]) == ("merge_pull_request", "deny")
    assert github.actions.get(key="merge_pull_request").policy == "deny"


@pytest.mark.django_db
def test_bad_changes_are_refused_with_codes(client_for, org_admin, github):
    api = client_for(org_admin)
    response = api.patch(action_url(github, "launch_rockets"), {"policy": "deny"}, format="json")
    assert (response.status_code, error_code(response)) == (404, "apps.unknown_action")
    response = api.patch(action_url(github, "search"), {"policy": "maybe"}, format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid_input")
    response = api.patch(app_url(github), {"url_patterns": ["nope"]}, format="json")
    assert (response.status_code, error_code(response)) == (400, "apps.invalid_url_pattern")
    github.refresh_from_db()
    assert github.url_patterns == ["https://api.github.com"]


@pytest.mark.django_db
def test_an_admin_sets_and_removes_the_organization_credential(client_for, org_admin, github):
    api = client_for(org_admin)
    response = api.put(
        credential_url(github), {"scope": "organization", "secret": SECRET}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["has_organization_credential"] is True
    assert response.json()["has_my_credential"] is False
    assert AppCredential.objects.get(app=github, user=None).secret == SECRET

    response = api.delete(credential_url(github), {"scope": "organization"}, format="json")
    assert response.status_code == 204
    assert not AppCredential.objects.exists()


# --- strangers ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_stranger_sees_none_of_another_organizations_apps(client_for, stranger, github):
    api = client_for(stranger)
    assert api.get(APPS).json()["results"] == []
    assert api.get(CATALOG).json()["results"][0]["app_id"] is None
    assert api.get(app_url(github)).status_code == 404
    response = api.put(credential_url(github), {"secret": "t"}, format="json")
    assert (response.status_code, error_code(response)) == (404, "not_found")
    assert api.delete(credential_url(github)).status_code == 404


@pytest.mark.django_db
def test_another_organizations_admin_gets_404_for_every_admin_operation(
    client_for, stranger_admin, github
):
    api = client_for(stranger_admin)
    for response in [
        api.patch(app_url(github), {"enabled": False}, format="json"),
        api.patch(action_url(github, "delete_repository"), {"policy": "auto"}, format="json"),
        api.put(credential_url(github), {"scope": "organization", "secret": "t"}, format="json"),
        api.delete(f"{credential_url(github)}?scope=organization"),
    ]:
        assert response.status_code == 404
    github.refresh_from_db()
    assert github.enabled
    assert github.actions.get(key="delete_repository").policy == "deny"
    assert not AppCredential.objects.exists()


# --- secrets ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_no_response_ever_contains_a_secret(client_for, owner, org_admin, github):
    admin_api, member_api = client_for(org_admin), client_for(owner)
    responses = [
        admin_api.put(
            credential_url(github), {"scope": "organization", "secret": SECRET}, format="json"
        ),
        member_api.put(credential_url(github), {"secret": SECRET + "-mine"}, format="json"),
        admin_api.get(APPS),
        admin_api.get(app_url(github)),
        member_api.get(APPS),
        member_api.get(app_url(github)),
        admin_api.patch(app_url(github), {"name": "GitHub (Acme)"}, format="json"),
        admin_api.get(CATALOG),
        admin_api.get("/api/schema/"),
    ]
    for response in responses:
        assert response.status_code == 200
        assert SECRET.encode() not in response.content
    assert AppCredential.objects.count() == 2
