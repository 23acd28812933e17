"""An agent turn starts a web app with its tool; Quor records it and serves it."""

import http.client

import pytest
from django.test import Client

from quor.models import ModelProvider
from sandboxes.models import Session
from tests import factories
from tests.environment import PORTS
from tests.sandboxes.test_agent_session_e2e import collect_until
from tests.sandboxes.test_event_stream import cookie_for
from webapps.models import WebApp

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

SCRIPT = [
    {
        "text": "Starting the site.",
        "tool_calls": [
            {
                "name": "write_file",
                "input": {"path": "site/index.html", "content": "<h1>Hello from the agent</h1>"},
            },
            {
                "name": "start_web_app",
                "input": {
                    "command": "python3 -m http.server --bind 0.0.0.0 --directory site 8081",
                    "port": 8081,
                },
            },
        ],
    },
    {"text": "Your site is running."},
]


def test_an_agent_starts_a_web_app_that_the_owner_opens(
    client_for,
    owner,
    org,
    egress_proxy,
    webapp_proxy,
    celery_worker,
    clean_runtimes,
    upstream_fakes,
):
    provider = factories.make_provider(
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url=f"https://model.test:{PORTS.MODEL}",
        model_names=["scripted"],
    )  # fmt: skip
    upstream_fakes.model.script = SCRIPT
    upstream_fakes.model.requests.clear()
    response = client_for(owner).post(
        "/api/v1/sessions/",
        {"prompt": "Build me a site.", "model": f"{provider.pk}:scripted"},
        format="json",
    )
    session = Session.objects.get(pk=response.json()["id"])
    events = collect_until(
        cookie_for(owner), session, 0, lambda e: e["kind"] in ("turn_finished", "error")
    )
    assert events[-1]["kind"] == "turn_finished", [e["kind"] for e in events]
    started = [e for e in events if e["kind"] == "webapp_started"]
    assert len(started) == 1
    webapp = WebApp.objects.get(session=session)
    assert (webapp.port, webapp.status) == (8081, "running")

    browser = Client()
    browser.force_login(owner)
    handoff = browser.get(started[0]["payload"]["webapp"]["open_url"])
    host = f"{webapp.label}.localhost:{webapp_proxy[1]}"
    connection = http.client.HTTPConnection(*webapp_proxy, timeout=30)
    connection.request("GET", handoff["Location"].split(host, 1)[1], headers={"Host": host})
    cookie = connection.getresponse().getheader("Set-Cookie").split(";")[0]
    connection = http.client.HTTPConnection(*webapp_proxy, timeout=30)
    connection.request("GET", "/", headers={"Host": host, "Cookie": cookie})
    page = connection.getresponse()
    assert page.status == 200
    assert b"Hello from the agent" in page.read()
