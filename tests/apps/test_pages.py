"""The Apps page: members see their organization's enabled Apps and policies, and
connect or disconnect their own token. The token is never shown."""

import pytest
from django.test import Client
from django.urls import reverse

from apps import services
from apps.models import AppCredential
from tests import factories
from tests.apps.conftest import SECRET

PAGE = reverse("app-list")


def connect_url(app):
    return reverse("app-credential-set", args=[app.pk])


def disconnect_url(app):
    return reverse("app-credential-clear", args=[app.pk])


@pytest.mark.django_db
def test_the_apps_page_needs_a_login(client, github):
    response = client.get(PAGE)
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]
    assert client.post(connect_url(github), {"secret": "t"}).status_code == 302
    assert not AppCredential.objects.exists()


@pytest.mark.django_db
def test_a_member_sees_enabled_apps_with_their_actions_and_policies(client, owner, org, github):
    services.app_create_custom(
        organization=org, name="Secret Project", url_patterns=["https://s.test"], enabled=False
    )
    services.app_create_custom(organization=org, name="Intranet", url_patterns=["https://i.test"])
    client.force_login(owner)
    page = client.get(PAGE).content.decode()
    assert "GitHub" in page and "Intranet" in page
    assert "Secret Project" not in page
    assert "Delete repositories" in page and "Deny" in page
    assert "Merge pull requests and branches" in page and "Auto-approve" in page
    assert "Every request to a custom App is <strong>Ask</strong>" in page
    assert "not connected" in page


@pytest.mark.django_db
def test_the_navigation_links_to_the_apps_page(client, owner):
    client.force_login(owner)
    assert f'href="{PAGE}"' in client.get(reverse("home")).content.decode()


@pytest.mark.django_db
def test_a_member_connects_and_disconnects_their_token(client, owner, github):
    client.force_login(owner)
    response = client.post(connect_url(github), {"secret": SECRET})
    assert response.status_code == 302
    assert AppCredential.objects.get(app=github, user=owner).secret == SECRET

    page = client.get(PAGE).content.decode()
    assert "Your GitHub token is connected." in page
    assert "connected" in page and "Disconnect my token" in page
    assert SECRET not in page

    assert client.post(disconnect_url(github)).status_code == 302
    assert not AppCredential.objects.filter(app=github).exists()
    page = client.get(PAGE).content.decode()
    assert "Your GitHub token is removed." in page
    assert "Your GitHub token is connected." not in page  # shown once


@pytest.mark.django_db
def test_a_bad_token_is_explained_and_not_stored(client, owner, org):
    jira = services.app_enable_builtin(organization=org, catalog_key="jira")
    client.force_login(owner)
    response = client.post(connect_url(jira), {"secret": "token-without-email"}, follow=True)
    page = response.content.decode()
    assert "Jira: This App takes user:token" in page
    assert "token is connected" not in page
    assert not AppCredential.objects.exists()


@pytest.mark.django_db
def test_a_token_with_whitespace_inside_is_explained_and_not_stored(client, owner, github):
    client.force_login(owner)
    response = client.post(connect_url(github), {"secret": "two words"}, follow=True)
    page = response.content.decode()
    assert "GitHub: The credential must not contain spaces" in page
    assert "token is connected" not in page
    assert not AppCredential.objects.exists()


@pytest.mark.django_db
def test_forms_need_the_csrf_token(owner, github):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post(connect_url(github), {"secret": SECRET}).status_code == 403
    assert not AppCredential.objects.exists()
    assert 'name="csrfmiddlewaretoken"' in client.get(PAGE).content.decode()


@pytest.mark.django_db
def test_another_organizations_or_a_disabled_app_is_404(client, owner, org, stranger, github):
    disabled = services.app_create_custom(
        organization=org, name="Off", url_patterns=["https://o.test"], enabled=False
    )
    client.force_login(owner)
    assert client.post(connect_url(disabled), {"secret": "t"}).status_code == 404
    client.force_login(stranger)
    assert client.post(connect_url(github), {"secret": "t"}).status_code == 404
    assert client.post(disconnect_url(github)).status_code == 404
    assert f"app-{github.pk}" not in client.get(PAGE).content.decode()
    assert not AppCredential.objects.exists()


@pytest.mark.django_db
def test_a_user_without_an_organization_gets_an_explanation(client, db):
    from quor.models import User

    loner = User.objects.create_user(email="loner@example.com", password=factories.PASSWORD)
    client.force_login(loner)
    response = client.get(PAGE)
    assert response.status_code == 403
    assert "does not belong to an organization" in response.content.decode()


@pytest.mark.django_db
def test_the_organization_token_is_never_shown_on_the_page(client, owner, github):
    services.app_credential_set(app=github, user=None, secret=SECRET)
    client.force_login(owner)
    page = client.get(PAGE).content.decode()
    assert "Organization token: <strong>set</strong>" in page
    assert SECRET not in page
