"""Who may open a web app, and what sharing it does not expose."""

import time

import pytest
from django.core import signing

from sandboxes.models import Session
from tests import factories
from webapps import headers as header_rules
from webapps import services
from webapps.models import WebApp

pytestmark = pytest.mark.django_db


@pytest.fixture
def webapp(owner):
    session = factories.make_session(owner)
    return WebApp.objects.create(session=session, port=8080, command="python3 -m http.server")


@pytest.mark.parametrize(
    ("host", "label"),
    [
        ("wabc.localhost:18000", "wabc"),
        ("WABC.LOCALHOST:18000", "wabc"),
        ("wabc.localhost", "wabc"),
        ("localhost:18000", None),
        ("a.b.localhost:18000", None),
        ("wabc.localhost.evil.test", None),
        ("evil-localhost:18000", None),
        ("[::1]:18000", None),
        ("", None),
    ],
)
def test_only_hosts_directly_under_the_base_host_are_web_apps(host, label):
    assert services.label_for_host(host) == label


def test_sharing_with_the_organization_exposes_the_app_and_nothing_else(
    webapp, owner, colleague, stranger, client, client_for
):
    Session.objects.filter(pk=webapp.session_id).update(sharing=Session.Sharing.ORGANIZATION)
    webapp.refresh_from_db()
    assert services.can_view(colleague, webapp)
    assert not services.can_view(stranger, webapp)
    session_id = webapp.session_id
    api = client_for(colleague)
    assert api.get(f"/api/v1/sessions/{session_id}/").status_code == 404
    assert api.get(f"/api/v1/sessions/{session_id}/events/").status_code == 404
    assert api.get(f"/api/v1/sessions/{session_id}/files/", {"path": ""}).status_code == 404
    client.force_login(colleague)
    assert client.get(f"/sessions/{session_id}/").status_code == 404
    assert client.get(f"/webapps/{webapp.label}/open").status_code == 302


def test_inactive_users_and_disabled_organizations_lose_access(webapp, owner, colleague):
    Session.objects.filter(pk=webapp.session_id).update(sharing=Session.Sharing.ORGANIZATION)
    webapp.refresh_from_db()
    organization = colleague.membership.organization
    organization.is_active = False
    organization.save()
    colleague.refresh_from_db()
    assert not services.can_view(colleague, webapp)
    owner.is_active = False
    assert not services.can_view(owner, webapp)


def test_a_handoff_is_good_for_one_app_and_one_minute(webapp, owner, monkeypatch):
    url = services.handoff_url(owner, webapp, "/page?x=1")
    token = url.split("token=")[1].split("&")[0]
    from urllib.parse import unquote

    token = unquote(token)
    assert services.read_handoff(token, webapp.label) == owner.pk
    assert services.read_handoff(token, "wother") is None
    later = time.time() + services.HANDOFF_SECONDS + 5
    monkeypatch.setattr(signing.time, "time", lambda: later)
    assert services.read_handoff(token, webapp.label) is None


@pytest.mark.parametrize(
    ("requested", "kept"),
    [
        ("/page?x=1", "/page?x=1"),
        ("//evil.test/", "/"),
        ("https://evil.test/", "/"),
        ("/\\evil.test", "/"),
        ("page", "/"),
    ],
)
def test_the_handoff_only_returns_to_a_path_on_the_apps_own_origin(requested, kept):
    assert services.safe_next(requested) == kept


def test_the_viewer_cookie_is_signed_for_one_app():
    value = services.viewer_cookie(7, "wabc")
    assert services.read_viewer_cookie(value, "wabc") == 7
    assert services.read_viewer_cookie(value, "wxyz") is None
    assert services.read_viewer_cookie(value[:-2] + "xx", "wabc") is None


def test_the_header_rules_remove_credentials_identity_and_hop_by_hop_headers():
    kept = header_rules.request_headers_to_forward(
        [
            ("Accept", "text/html"),
            ("Cookie", "a=b"),
            ("X-Forwarded-For", "1.2.3.4"),
            ("X-Auth-Request-User", "ceo"),
            ("Connection", "keep-alive, X-Secret-Hop"),
            ("X-Secret-Hop", "1"),
            ("Range", "bytes=0-1"),
            ("X-Quor-Anything", "1"),
        ]
    )
    assert kept == [("accept", "text/html"), ("range", "bytes=0-1")]
    returned = header_rules.response_headers_to_return(
        [
            ("Set-Cookie", "a=b"),
            ("Content-Type", "text/html"),
            ("Transfer-Encoding", "chunked"),
            ("X-Accel-Redirect", "/internal/"),
            ("X-Accel-Limit-Rate", "1"),
            ("X-Sendfile", "/etc/passwd"),
            ("X-Lighttpd-Send-File", "/etc/passwd"),
        ]
    )
    assert returned == [
        ("content-type", "text/html"),
        ("content-security-policy", header_rules.SANDBOX_CSP),
    ]


def test_opening_an_app_is_activity_and_wakes_a_sleeping_sandbox(
    webapp, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    from sandboxes.models import Sandbox

    sandbox = webapp.session.sandbox
    long_ago = timezone.now() - timedelta(hours=1)
    Sandbox.objects.filter(pk=sandbox.pk).update(state="running", last_activity_at=long_ago)
    webapp.session.sandbox.refresh_from_db()
    with django_capture_on_commit_callbacks() as enqueued:
        assert services.webapp_opened(webapp) is False
    assert enqueued == []
    sandbox.refresh_from_db()
    assert sandbox.last_activity_at > long_ago

    for state in (Sandbox.State.SLEEPING, Sandbox.State.SNAPSHOTTING, Sandbox.State.RESTORING):
        webapp.session.sandbox.state = state
        with django_capture_on_commit_callbacks() as enqueued:
            assert services.webapp_opened(webapp) is True
        assert len(enqueued) == 1, state  # the wake (ensure_sandbox), once committed
    webapp.session.sandbox.state = Sandbox.State.STOPPED  # an operator's stop is kept
    with django_capture_on_commit_callbacks() as enqueued:
        assert services.webapp_opened(webapp) is False
    assert enqueued == []
