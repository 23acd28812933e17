"""Apps in the Django admin: pages render, adding a built-in or custom App works, the
action policies are edited inline, organization admins see only their organization,
and the credential is write-only."""

import pytest
from django.urls import reverse

from apps import services
from apps.admin import CUSTOM
from apps.models import App, AppCredential
from tests.apps.conftest import SECRET

CHANGELIST = reverse("admin:integrations_app_changelist")
ADD = reverse("admin:integrations_app_add")


def change_url(app):
    return reverse("admin:integrations_app_change", args=[app.pk])


@pytest.fixture
def populated(org, owner, github):
    services.app_credential_set(app=github, user=None, secret=SECRET)
    services.app_credential_set(app=github, user=owner, secret=SECRET + "-owner")
    services.app_create_custom(organization=org, name="Intranet", url_patterns=["https://i.test"])
    return github


def change_form_data(client, app, **changes):
    """The change form as the browser would post it, inline policies included."""
    page = client.get(change_url(app))
    assert page.status_code == 200
    data = {
        "name": app.name,
        "description": app.description,
        "url_patterns_text": "\n".join(app.url_patterns),
        "enabled": "on" if app.enabled else "",
        "when_not_selected": app.when_not_selected,
        "credential_style": app.credential_style,
        "credential_header": app.credential_header,
        "organization_credential": "",
    }
    for inline in page.context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        for name in ("TOTAL_FORMS", "INITIAL_FORMS", "MIN_NUM_FORMS", "MAX_NUM_FORMS"):
            data[f"{formset.prefix}-{name}"] = management[name].value()
        for form in formset.forms:
            data[f"{form.prefix}-id"] = form.instance.pk
            data[f"{form.prefix}-app"] = app.pk
            data[f"{form.prefix}-policy"] = form.instance.policy
    return {**data, **changes}


def inline_prefix(app, key):
    keys = list(app.actions.order_by("name").values_list("key", flat=True))
    return f"actions-{keys.index(key)}"


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["superuser", "org_admin"])
def test_the_app_pages_render_for_superusers_and_organization_admins(
    client, populated, persona, request
):
    client.force_login(request.getfixturevalue(persona))
    for url in [
        CHANGELIST,
        CHANGELIST + "?q=git",
        CHANGELIST + "?kind=custom",
        CHANGELIST + "?kind=builtin&enabled__exact=1",
        ADD,
        ADD + "?source=jira",
        change_url(populated),
        change_url(App.objects.get(name="Intranet")),
    ]:
        response = client.get(url)
        assert response.status_code == 200, url
        assert SECRET.encode() not in response.content, url


@pytest.mark.django_db
def test_the_changelist_says_what_each_app_is(client, org_admin, populated):
    client.force_login(org_admin)
    page = client.get(CHANGELIST).content.decode()
    assert "Built-in: GitHub" in page
    assert "Custom" in page
    assert "Organization credential set" in page


@pytest.mark.django_db
def test_the_add_page_explains_apps_and_prefills_a_built_in_app(client, org_admin):
    client.force_login(org_admin)
    page = client.get(ADD + "?source=jira").content.decode()
    assert "egress proxy" in page
    assert 'href="?source=github"' in page
    assert "https://*.atlassian.net" in page
    assert "Custom App" in page


@pytest.mark.django_db
def test_the_change_page_shows_the_actions_and_never_the_credential(client, org_admin, populated):
    client.force_login(org_admin)
    page = client.get(change_url(populated)).content.decode()
    assert "Actions and their policies" in page
    assert "Delete repositories" in page
    assert "/repos/{owner}/{repo}/hooks/**" in page
    assert "An organization credential is set." in page
    assert SECRET not in page


@pytest.mark.django_db
def test_an_org_admin_adds_a_built_in_app_with_its_credential(client, org_admin, org):
    client.force_login(org_admin)
    response = client.post(
        ADD,
        {
            "organization": org.pk,
            "source": "jira",
            "name": "",
            "description": "",
            "url_patterns_text": "https://acme.atlassian.net\n",
            "enabled": "on",
            "when_not_selected": "forward",
            "credential_style": "bearer",
            "credential_header": "",
            "organization_credential": "bot@acme.test:" + SECRET,
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    app = App.objects.get(catalog_key="jira")
    assert (app.organization, app.name) == (org, "Jira")
    assert app.credential_style == "basic"  # the catalog's, whatever the form said
    assert app.url_patterns == ["https://acme.atlassian.net"]
    assert app.actions.get(key="delete_issue").policy == "deny"
    assert AppCredential.objects.get(app=app, user=None).secret == "bot@acme.test:" + SECRET


@pytest.mark.django_db
def test_an_org_admin_adds_a_custom_app(client, org_admin, org):
    client.force_login(org_admin)
    response = client.post(
        ADD,
        {
            "organization": org.pk,
            "source": CUSTOM,
            "name": "Billing",
            "url_patterns_text": "https://billing.example.com/api\nhttps://*.billing.example.com",
            "enabled": "on",
            "when_not_selected": "deny",
            "credential_style": "header",
            "credential_header": "X-Api-Key",
            "organization_credential": "",
        },
    )
    assert response.status_code == 302
    app = App.objects.get(name="Billing")
    assert app.is_custom
    assert app.url_patterns == ["https://billing.example.com/api", "https://*.billing.example.com"]
    assert (app.credential_header, app.when_not_selected) == ("x-api-key", "deny")
    assert not AppCredential.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"url_patterns_text": "billing.example.com"}, "url_patterns_text", "https://"),
        ({"url_patterns_text": ""}, "url_patterns_text", "at least one URL pattern"),
        ({"name": ""}, "name", "needs a name"),
        ({"credential_style": "header"}, "credential_header", "header name"),
        ({"source": "github"}, "source", "already added"),
        ({"organization_credential": "two\nlines"}, "organization_credential", "one line"),
        ({"organization_credential": "two words"}, "organization_credential", "spaces"),
    ],
)
def test_bad_input_in_the_add_form_is_a_form_error_and_adds_nothing(
    client, org_admin, org, github, changes, field, message
):
    client.force_login(org_admin)
    form = {
        "organization": org.pk,
        "source": CUSTOM,
        "name": "Billing",
        "url_patterns_text": "https://billing.example.com",
        "enabled": "on",
        "when_not_selected": "forward",
        "credential_style": "bearer",
        "credential_header": "",
        "organization_credential": "",
    }
    response = client.post(ADD, {**form, **changes})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors[field]), errors
    assert list(App.objects.all()) == [github]


@pytest.mark.django_db
def test_an_org_admin_cannot_add_an_app_to_another_organization(client, org_admin, stranger):
    client.force_login(org_admin)
    foreign = stranger.membership.organization
    response = client.post(
        ADD,
        {
            "organization": foreign.pk,
            "source": "github",
            "url_patterns_text": "",
            "enabled": "on",
            "when_not_selected": "forward",
            "credential_style": "bearer",
        },
    )
    assert response.status_code == 200
    assert "organization" in response.context["adminform"].form.errors
    assert not App.objects.exists()


@pytest.mark.django_db
def test_policies_are_edited_inline_on_the_app_page(client, org_admin, populated):
    client.force_login(org_admin)
    data = change_form_data(
        client,
        populated,
        **{
            f"{inline_prefix(populated, 'delete_repository')}-policy": "ask",
            f"{inline_prefix(populated, 'read_contents')}-policy": "deny",
        },
    )
    response = client.post(change_url(populated), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    policies = dict(populated.actions.values_list("key", "policy"))
    assert policies["delete_repository"] == "ask"
    assert policies["read_contents"] == "deny"
    assert policies["merge_pull_request"] == "ask"
    assert AppCredential.objects.get(app=populated, user=None).secret == SECRET  # kept


@pytest.mark.django_db
def test_catalog_fields_of_actions_cannot_be_changed_from_the_admin(client, org_admin, populated):
    client.force_login(org_admin)
    prefix = inline_prefix(populated, "delete_repository")
    data = change_form_data(
        client,
        populated,
        **{f"{prefix}-name": "Harmless", f"{prefix}-paths": '["/nothing"]', f"{prefix}-key": "x"},
    )
    assert client.post(change_url(populated), data).status_code == 302
    action = populated.actions.get(key="delete_repository")
    assert (action.name, action.paths) == ("Delete repositories", ["/repos/{owner}/{repo}"])


@pytest.mark.django_db
def test_the_credential_can_be_replaced_or_removed_but_not_both(client, org_admin, populated):
    client.force_login(org_admin)
    url = change_url(populated)
    response = client.post(
        url,
        change_form_data(client, populated, organization_credential="new", remove_credential="on"),
    )
    assert response.status_code == 200
    assert AppCredential.objects.get(app=populated, user=None).secret == SECRET

    data = change_form_data(client, populated, organization_credential="ghp_replaced")
    assert client.post(url, data).status_code == 302
    assert AppCredential.objects.get(app=populated, user=None).secret == "ghp_replaced"

    data = change_form_data(client, populated, remove_credential="on")
    assert client.post(url, data).status_code == 302
    assert not AppCredential.objects.filter(app=populated, user=None).exists()
    assert AppCredential.objects.filter(app=populated, user__isnull=False).exists()


@pytest.mark.django_db
def test_renaming_to_another_apps_name_is_a_form_error(client, org_admin, populated):
    client.force_login(org_admin)
    response = client.post(
        change_url(populated), change_form_data(client, populated, name="intranet")
    )
    assert response.status_code == 200
    assert "already has an App" in str(response.context["adminform"].form.errors["name"])


@pytest.mark.django_db
def test_the_sync_action_brings_actions_back_in_line_with_the_catalog(client, org_admin, populated):
    client.force_login(org_admin)
    services.app_set_action_policy(app=populated, key="search", policy="deny")
    populated.actions.filter(key="graphql").delete()
    populated.actions.filter(key="search").update(paths=["/elsewhere"])
    response = client.post(
        CHANGELIST,
        {"action": "sync_with_catalog", "_selected_action": [populated.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "GitHub: added graphql, updated search." in response.content.decode()
    search = populated.actions.get(key="search")
    assert (search.paths, search.policy) == (["/search/**"], "deny")
    assert populated.actions.filter(key="graphql", policy="ask").exists()


@pytest.mark.django_db
def test_an_org_admin_sees_only_their_organizations_apps(client, org_admin, populated, stranger):
    foreign = services.app_create_custom(
        organization=stranger.membership.organization,
        name="Foreign",
        url_patterns=["https://f.test"],
    )
    client.force_login(org_admin)
    page = client.get(CHANGELIST).content.decode()
    assert "GitHub" in page and "Foreign" not in page
    assert "Globex" not in page  # no organization filter listing other organizations
    assert client.get(change_url(foreign)).status_code == 302
    response = client.post(change_url(foreign), {"name": "Taken over"})
    assert response.status_code in (302, 403)
    foreign.refresh_from_db()
    assert foreign.name == "Foreign"


@pytest.mark.django_db
def test_members_cannot_open_the_apps_admin(client, owner, populated):
    client.force_login(owner)
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_adding_a_built_in_app_twice_shows_one_clear_error(client, org_admin, org, github):
    client.force_login(org_admin)
    response = client.post(
        ADD,
        {
            "organization": org.pk,
            "source": "github",
            "name": "GitHub",
            "description": "",
            "url_patterns_text": "https://api.github.com",
            "enabled": "on",
            "when_not_selected": "forward",
            "credential_style": "bearer",
            "credential_header": "",
            "organization_credential": "",
        },
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors == {"source": ["GitHub is already added."]}
    assert list(App.objects.all()) == [github]
