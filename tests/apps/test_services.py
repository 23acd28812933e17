"""Adding Apps, their policies and credentials: bad input is a clear error with a code
and changes nothing; following the catalog keeps the organization's policies."""

import dataclasses

import pytest
from django.db import connection

from apps import selectors, services
from apps.catalog import CatalogAction, catalog_app
from apps.models import App, AppAction, AppCredential
from quor.lib.errors import Conflict, InvalidInput, NotFound, QuorError
from tests.apps.conftest import SECRET


def snapshot():
    """Everything the Apps services write, to prove a failed call wrote nothing."""
    return (
        list(App.objects.values().order_by("pk")),
        list(AppAction.objects.values().order_by("pk")),
        list(AppCredential.objects.values_list("app_id", "user_id", "secret").order_by("pk")),
    )


def raises_and_changes_nothing(code, call, **kwargs):
    before = snapshot()
    with pytest.raises(QuorError) as error:
        call(**kwargs)
    assert error.value.code == code, error.value.message
    assert snapshot() == before
    return error.value


# --- built-in Apps --------------------------------------------------------------------------


@pytest.mark.django_db
def test_enabling_a_built_in_app_creates_its_actions_with_default_policies(org):
    app = services.app_enable_builtin(organization=org, catalog_key="github")
    entry = catalog_app("github")
    assert (app.name, app.catalog_key, app.enabled) == ("GitHub", "github", True)
    assert app.url_patterns == ["https://api.github.com"]
    assert app.credential_style == "bearer"
    actions = {a.key: a for a in app.actions.all()}
    assert set(actions) == {a.key for a in entry.actions}
    assert actions["delete_repository"].policy == "deny"
    assert actions["read_contents"].policy == "auto"
    assert actions["merge_pull_request"].policy == "ask"
    assert actions["read_contents"].paths == list(entry.action("read_contents").paths)


@pytest.mark.django_db
def test_a_built_in_app_can_get_its_own_url_patterns(org):
    app = services.app_enable_builtin(
        organization=org, catalog_key="jira", url_patterns=["HTTPS://Acme.Atlassian.net:443/"]
    )
    assert app.url_patterns == ["https://acme.atlassian.net"]


@pytest.mark.django_db
def test_an_unknown_built_in_app_is_refused(org):
    raises_and_changes_nothing(
        "apps.unknown_catalog_app",
        services.app_enable_builtin,
        organization=org,
        catalog_key="myspace",
    )


@pytest.mark.django_db
def test_enabling_a_built_in_app_twice_is_a_conflict(org, github):
    error = raises_and_changes_nothing(
        "apps.exists", services.app_enable_builtin, organization=org, catalog_key="github"
    )
    assert isinstance(error, Conflict)


@pytest.mark.django_db
def test_a_built_in_app_cannot_take_the_name_of_a_custom_app(org):
    services.app_create_custom(organization=org, name="Slack", url_patterns=["https://x.test"])
    raises_and_changes_nothing(
        "apps.name_taken", services.app_enable_builtin, organization=org, catalog_key="slack"
    )


@pytest.mark.django_db
def test_bad_url_patterns_for_a_built_in_app_create_nothing(org):
    raises_and_changes_nothing(
        "apps.invalid_url_pattern",
        services.app_enable_builtin,
        organization=org,
        catalog_key="jira",
        url_patterns=["acme.atlassian.net"],
    )


@pytest.mark.django_db
def test_two_organizations_each_have_their_own_github(org, stranger, github):
    other = services.app_enable_builtin(
        organization=stranger.membership.organization, catalog_key="github"
    )
    assert other.pk != github.pk


# --- following the catalog ----------------------------------------------------------------------


def changed_github():
    """GitHub's catalog entry after an upgrade: one action renamed with a new path, one
    removed, one new."""
    entry = catalog_app("github")
    actions = []
    for action in entry.actions:
        if action.key == "graphql":
            continue
        if action.key == "search":
            action = dataclasses.replace(
                action, name="Search everything", paths=(*action.paths, "/search2/**")
            )
        actions.append(action)
    actions.append(
        CatalogAction(
            key="read_traffic",
            name="Read traffic",
            description="",
            methods=("GET",),
            paths=("/repos/{owner}/{repo}/traffic/**",),
            default_policy="auto",
        )
    )
    return dataclasses.replace(entry, actions=tuple(actions))


@pytest.mark.django_db
def test_syncing_with_the_catalog_keeps_the_organizations_policies(github, monkeypatch):
    services.app_set_action_policy(app=github, key="search", policy="deny")
    services.app_set_action_policy(app=github, key="delete_repository", policy="ask")
    monkeypatch.setattr(services, "catalog_app", lambda key: changed_github())

    result = services.app_sync_catalog(app=github)

    assert result.added == ("read_traffic",)
    assert result.updated == ("search",)
    assert result.removed == ("graphql",)
    actions = {a.key: a for a in github.actions.all()}
    assert actions["search"].policy == "deny"
    assert actions["search"].name == "Search everything"
    assert "/search2/**" in actions["search"].paths
    assert actions["delete_repository"].policy == "ask"
    assert actions["read_traffic"].policy == "auto"
    assert "graphql" not in actions


@pytest.mark.django_db
def test_syncing_an_up_to_date_app_changes_nothing(github):
    before = snapshot()
    result = services.app_sync_catalog(app=github)
    assert not result.changed
    assert snapshot() == before


@pytest.mark.django_db
def test_a_custom_app_does_not_follow_the_catalog(org):
    app = services.app_create_custom(
        organization=org, name="Intranet", url_patterns=["https://i.test"]
    )
    raises_and_changes_nothing("apps.not_builtin", services.app_sync_catalog, app=app)


# --- custom Apps --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_custom_app_is_created_with_canonical_url_patterns_and_no_actions(org):
    app = services.app_create_custom(
        organization=org,
        name="  Billing API ",
        url_patterns=["https://billing.example.com/api/", "https://BILLING.example.com/api"],
        credential_style="header",
        credential_header="X-Api-Key",
    )
    assert app.name == "Billing API"
    assert app.url_patterns == ["https://billing.example.com/api"]
    assert (app.credential_style, app.credential_header) == ("header", "x-api-key")
    assert app.is_custom and not app.actions.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"name": " "}, "apps.invalid_name"),
        ({"name": "x" * 101}, "apps.invalid_name"),
        ({"url_patterns": []}, "apps.invalid_url_pattern"),
        ({"url_patterns": "https://api.example.com"}, "apps.invalid_url_pattern"),
        ({"url_patterns": ["https://api.example.com/v1?x=1"]}, "apps.invalid_url_pattern"),
        ({"url_patterns": ["https://exa mple.com"]}, "apps.invalid_url_pattern"),
        ({"url_patterns": [42]}, "apps.invalid_url_pattern"),
        ({"credential_style": "cookie"}, "apps.invalid_credential_style"),
        ({"credential_style": "header"}, "apps.invalid_credential_header"),
        ({"credential_style": "header", "credential_header": "Bad Header"},
         "apps.invalid_credential_header"),
        ({"credential_style": "header", "credential_header": "Host"},
         "apps.invalid_credential_header"),
        ({"credential_style": "header", "credential_header": "Proxy-Whatever"},
         "apps.invalid_credential_header"),
        ({"when_not_selected": "sometimes"}, "apps.invalid_when_not_selected"),
    ],
)  # fmt: skip
def test_a_custom_app_with_bad_input_is_refused_and_nothing_is_created(org, fields, code):
    kwargs = {"organization": org, "name": "Billing", "url_patterns": ["https://b.test"]}
    raises_and_changes_nothing(code, services.app_create_custom, **{**kwargs, **fields})


@pytest.mark.django_db
def test_a_custom_app_name_is_unique_in_the_organization_whatever_the_case(org, github):
    raises_and_changes_nothing(
        "apps.name_taken",
        services.app_create_custom,
        organization=org,
        name="github",
        url_patterns=["https://b.test"],
    )


@pytest.mark.django_db
def test_the_header_name_is_dropped_for_styles_that_do_not_use_it(org):
    app = services.app_create_custom(
        organization=org,
        name="B",
        url_patterns=["https://b.test"],
        credential_style="bearer",
        credential_header="X-Ignored",
    )
    assert app.credential_header == ""


# --- updates and policies ---------------------------------------------------------------------


@pytest.mark.django_db
def test_updating_an_app_changes_only_the_given_fields(github):
    app = services.app_update(
        app=github, enabled=False, url_patterns=["https://git.acme.test/api/v3"]
    )
    app.refresh_from_db()
    assert app.enabled is False
    assert app.url_patterns == ["https://git.acme.test/api/v3"]
    assert app.name == "GitHub"


@pytest.mark.django_db
def test_an_update_with_one_bad_field_writes_none_of_them(github):
    raises_and_changes_nothing(
        "apps.invalid_url_pattern",
        services.app_update,
        app=github,
        name="Renamed",
        enabled=False,
        url_patterns=["nope"],
    )
    github.refresh_from_db()
    assert (github.name, github.enabled) == ("GitHub", True)


@pytest.mark.django_db
def test_renaming_an_app_to_another_apps_name_is_a_conflict(org, github):
    services.app_enable_builtin(organization=org, catalog_key="slack")
    raises_and_changes_nothing("apps.name_taken", services.app_update, app=github, name="Slack")


@pytest.mark.django_db
def test_switching_to_the_header_style_needs_a_header_name(github):
    raises_and_changes_nothing(
        "apps.invalid_credential_header", services.app_update, app=github, credential_style="header"
    )
    app = services.app_update(app=github, credential_style="header", credential_header="X-Token")
    assert (app.credential_style, app.credential_header) == ("header", "x-token")


@pytest.mark.django_db
def test_setting_an_action_policy(github):
    action = services.app_set_action_policy(app=github, key="merge_pull_request", policy="deny")
    assert action.policy == "deny"
    assert github.actions.get(key="merge_pull_request").policy == "deny"


@pytest.mark.django_db
def test_an_unknown_policy_or_action_is_refused(github):
    raises_and_changes_nothing(
        "apps.invalid_policy",
        services.app_set_action_policy,
        app=github,
        key="search",
        policy="sometimes",
    )
    error = raises_and_changes_nothing(
        "apps.unknown_action",
        services.app_set_action_policy,
        app=github,
        key="launch_rockets",
        policy="deny",
    )
    assert isinstance(error, NotFound)


# --- credentials --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_organization_and_user_credentials_are_separate_and_replaceable(github, owner):
    services.app_credential_set(app=github, user=None, secret="org-token")
    services.app_credential_set(app=github, user=owner, secret="  my-token\n")
    services.app_credential_set(app=github, user=owner, secret="my-new-token")
    stored = dict(AppCredential.objects.filter(app=github).values_list("user_id", "secret"))
    assert stored == {None: "org-token", owner.pk: "my-new-token"}


@pytest.mark.django_db
def test_clearing_a_credential_removes_only_that_one_and_twice_is_harmless(github, owner):
    services.app_credential_set(app=github, user=None, secret="org-token")
    services.app_credential_set(app=github, user=owner, secret="my-token")
    assert services.app_credential_clear(app=github, user=owner) is True
    assert services.app_credential_clear(app=github, user=owner) is False
    assert list(AppCredential.objects.values_list("user_id", flat=True)) == [None]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("catalog_key", "secret"),
    [
        ("github", ""),
        ("github", "   "),
        ("github", "token\r\nX-Evil: 1"),
        ("github", "tökén"),
        ("github", "x" * 8193),
        ("jira", "just-a-token"),
        ("jira", ":token"),
        ("jira", "me@acme.test:"),
        ("github", "two words"),
        ("github", "Bearer ghp_token"),
        ("github", "tab\tinside"),
        ("github", "no\u00a0break"),
        ("jira", "me@acme.test: token"),
        ("jira", "me @acme.test:token"),
    ],
)
def test_a_credential_that_cannot_be_sent_as_one_header_is_refused(org, catalog_key, secret):
    app = services.app_enable_builtin(organization=org, catalog_key=catalog_key)
    raises_and_changes_nothing(
        "apps.invalid_secret", services.app_credential_set, app=app, user=None, secret=secret
    )


@pytest.mark.django_db
@pytest.mark.parametrize("style", ["bearer", "basic", "header"])
def test_a_credential_with_whitespace_inside_is_refused_in_every_style(org, style):
    app = services.app_create_custom(
        organization=org,
        name="Fake",
        url_patterns=["https://fake.test"],
        credential_style=style,
        credential_header="X-Api-Key" if style == "header" else "",
    )
    secret = "me@acme.test:two words" if style == "basic" else "two words"
    with pytest.raises(InvalidInput, match="must not contain spaces") as caught:
        services.app_credential_set(app=app, user=None, secret=secret)
    assert caught.value.code == "apps.invalid_secret"
    assert not AppCredential.objects.exists()
    # Around it, whitespace is still trimmed.
    secret = "me@acme.test:token" if style == "basic" else "token"
    assert services.app_credential_set(app=app, user=None, secret=f" {secret}\n").secret == secret


@pytest.mark.django_db
def test_jira_takes_email_and_token(org):
    app = services.app_enable_builtin(organization=org, catalog_key="jira")
    credential = services.app_credential_set(app=app, user=None, secret="me@acme.test:tok:en")
    assert credential.secret == "me@acme.test:tok:en"


@pytest.mark.django_db
def test_a_user_of_another_organization_cannot_have_a_credential_for_the_app(github, stranger):
    error = raises_and_changes_nothing(
        "apps.foreign_user", services.app_credential_set, app=github, user=stranger, secret="t"
    )
    assert isinstance(error, InvalidInput)


@pytest.mark.django_db
def test_credentials_are_encrypted_at_rest(github):
    services.app_credential_set(app=github, user=None, secret=SECRET)
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM integrations_appcredential")
        stored = bytes(cursor.fetchone()[0])
    assert SECRET.encode() not in stored


# --- access -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_members_see_enabled_apps_and_admins_see_all(org, owner, org_admin, github):
    hidden = services.app_create_custom(
        organization=org, name="Hidden", url_patterns=["https://h.test"], enabled=False
    )
    assert list(selectors.apps_visible_to(owner)) == [github]
    assert set(selectors.apps_visible_to(org_admin)) == {github, hidden}
    with pytest.raises(NotFound):
        services.get_app_for_member(owner, hidden.pk)
    assert services.get_app_for_member(org_admin, str(hidden.pk)) == hidden


@pytest.mark.django_db
def test_another_organizations_app_or_a_nonsense_id_is_not_found(github, stranger, org_admin):
    for app_id in (github.pk, "abc", "9" * 30, -1, True):
        with pytest.raises(NotFound):
            services.get_app_for_member(stranger, app_id)
    with pytest.raises(NotFound):
        services.get_app_for_admin(org_admin, "9" * 30)
