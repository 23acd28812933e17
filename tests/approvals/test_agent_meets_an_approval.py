"""A whole turn meets an App's policies: the agent (the runtime in a real sandbox,
driven by the scripted model) calls the fake App with curl; the Ask request waits
for the user, who approves it through the API after seeing the card on the WebSocket;
the Deny request comes back to the agent as a failed tool call it can report."""

import json

import pytest

from quor.models import ModelProvider
from sandboxes.models import Session
from tests import factories
from tests.environment import PORTS
from tests.sandboxes.test_agent_session_e2e import collect_until
from tests.sandboxes.test_event_stream import cookie_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

APP_TOKEN = "ghp_agent-e2e-token-0123456789abcdef"
REPO = f"https://apps.test:{PORTS.TLS_APP}/repos/acme/widgets"
SCRIPT = [
    {
        "text": "Opening the issue.",
        "tool_calls": [
            {
                "name": "run_command",
                "input": {"command": f"curl -sS -X POST -d '{{}}' {REPO}/issues"},
            }
        ],
    },
    {
        "text": "Deleting the repository.",
        "tool_calls": [{"name": "run_command", "input": {"command": f"curl -sS -X DELETE {REPO}"}}],
    },
    {
        "text": "Checking the token variable.",
        "tool_calls": [
            {
                "name": "run_command",
                "input": {
                    "command": 'test "$GH_TOKEN" = "$QUOR_CREDENTIAL_PLACEHOLDER" && echo placeholder-ok'
                },
            }
        ],
    },
    {"text": "The issue is open; deleting the repository is not allowed."},
]


def test_an_agent_waits_for_approval_and_reports_a_denied_action(
    client_for, owner, org, egress_proxy, celery_worker, clean_runtimes, upstream_fakes
):
    provider = factories.make_provider(
        org, kind=ModelProvider.Kind.ANTHROPIC, base_url=f"https://model.test:{PORTS.MODEL}",
        model_names=["scripted"],
    )  # fmt: skip
    app = factories.make_app(
        org,
        name="FakeHub",
        catalog_key="github",
        credential=APP_TOKEN,
        actions=[
            ("issues.create", "POST", "/repos/{owner}/{repo}/issues", "ask"),
            ("repos.delete", "DELETE", "/repos/{owner}/{repo}", "deny"),
        ],
    )
    upstream_fakes.model.script = SCRIPT
    upstream_fakes.model.requests.clear()
    upstream_fakes.tls_app.requests.clear()
    api = client_for(owner)
    response = api.post(
        "/api/v1/sessions/",
        {"prompt": "Open an issue, then delete the repo.", "model": f"{provider.pk}:scripted",
         "apps": [app.pk]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.json()
    session = Session.objects.get(pk=response.json()["id"])
    cookie = cookie_for(owner)

    events = collect_until(cookie, session, 0, lambda e: e["kind"] == "approval_requested")
    card = events[-1]["payload"]["approval"]
    assert card["summary"].startswith("FakeHub: ")
    assert upstream_fakes.tls_app.requests == []
    decision = api.post(
        f"/api/v1/approvals/{card['id']}/decision/", {"decision": "approve_once"}, format="json"
    )
    assert decision.status_code == 200

    events = collect_until(
        cookie, session, events[-1]["seq"], lambda e: e["kind"] in ("turn_finished", "error")
    )
    assert events[-1]["kind"] == "turn_finished", events[-1]
    results = [e["payload"] for e in events if e["kind"] == "tool_result"]
    assert '"server": "tls-app"' in results[0]["output"]
    assert "apps.action_denied" in results[1]["output"]
    assert "placeholder-ok" in results[2]["output"]  # tools find GH_TOKEN, a placeholder
    [received] = upstream_fakes.tls_app.requests
    assert (received["method"], received["headers"]["authorization"]) == (
        "POST",
        f"Bearer {APP_TOKEN}",
    )
    last_model_request = json.dumps(upstream_fakes.model.requests[-1]["body"])
    assert "apps.action_denied" in last_model_request  # the agent saw it
    assert APP_TOKEN not in last_model_request
