"""Quor's pages carry a Content-Security-Policy that allows only Quor's own scripts and
styles; responses with a policy of their own keep it."""

import pytest

from tests.environment import PORTS

pytestmark = pytest.mark.django_db


def policy_of(response) -> dict[str, str]:
    directives = (
        part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";")
    )
    return {name: rest for name, rest in directives}


def test_a_page_runs_only_quors_own_scripts_and_styles(client, owner):
    client.force_login(owner)
    response = client.get("/")
    assert response.status_code == 200
    policy = policy_of(response)
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["img-src"] == "'self' data: blob:"
    assert policy["frame-ancestors"] == "'none'"
    assert f"http://*.localhost:{PORTS.WEBAPP_PROXY}" in policy["frame-src"]
    assert policy["connect-src"] == "'self' ws://testserver wss://testserver"


def test_the_login_page_has_the_policy_too(client):
    assert policy_of(client.get("/accounts/login/"))["script-src"] == "'self'"


def test_json_and_the_api_docs_get_no_page_policy(client_for, owner):
    client = client_for(owner)
    assert "Content-Security-Policy" not in client.get("/api/v1/me/")
    assert "Content-Security-Policy" not in client.get("/api/docs/")


def test_the_admin_may_style_inline_but_runs_only_quors_scripts(client, superuser):
    client.force_login(superuser)
    policy = policy_of(client.get("/admin/"))
    assert policy["style-src"] == "'self' 'unsafe-inline'"
    assert policy["script-src"] == "'self'"
