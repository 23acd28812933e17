"""App policies and approvals from where the agent stands: requests from inside a
real sandbox, as the sandbox user, through the real egress proxy, to a fake App (a
real HTTPS server on loopback that records the headers it receives). Decisions go
through the real API; the card is watched over the real WebSocket of daphne."""

import json
import threading
import time

import pytest
import redis
from django.conf import settings
from django.test import Client

from approvals.models import ApprovalRequest
from quor.models import ModelProvider
from sandboxes.models import ScheduledRun, ScheduledTask
from sandboxes.runtime import services
from tests import factories
from tests.egress.test_proxy import error_code, places_holding, through_proxy
from tests.environment import PORTS, REDIS_DATABASE

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

APP_TOKEN = "ghp_real-app-token-never-in-the-sandbox-0123456789"
REPO = "/repos/acme/widgets"


@pytest.fixture
def app(org):
    return factories.make_app(
        org,
        name="FakeHub",
        catalog_key="github",
        credential=APP_TOKEN,
        actions=[
            ("repos.read", "GET", "/repos/{owner}/{repo}", "auto"),
            ("issues.create", "POST", "/repos/{owner}/{repo}/issues", "ask"),
            ("pulls.merge", "PUT", "/repos/{owner}/{repo}/pulls/{n}/merge", "ask"),
            ("repos.delete", "DELETE", "/repos/{owner}/{repo}", "deny"),
        ],
    )


@pytest.fixture
def session(owner, org, app, egress_proxy, clean_runtimes, upstream_fakes):
    provider = factories.make_provider(org, kind=ModelProvider.Kind.ANTHROPIC)
    services.sandbox_ensure(user=owner)
    session = factories.make_session(owner, provider)
    session.apps.set([app])
    upstream_fakes.tls_app.requests.clear()
    return session


def call(method, path, **extra):
    step = {"tunnel": ["apps.test", PORTS.TLS_APP], "url": path, "method": method, **extra}
    if method in ("POST", "PUT", "PATCH"):
        step.setdefault("body", "{}")
        step.setdefault("headers", {"Content-Type": "application/json"})
    return step


def received_by_app(fakes, method=None):
    return [r for r in fakes.tls_app.requests if method is None or r["method"] == method]


class InBackground:
    """Runs requests from the sandbox in a thread: a parked request blocks its caller."""

    def __init__(self, owner, steps, session):
        self.result = None
        self.thread = threading.Thread(
            target=lambda: setattr(self, "result", through_proxy(owner, steps, session=session))
        )
        self.thread.start()

    def wait(self, timeout=60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the sandbox's request never finished"
        return self.result


# Runs inside the sandbox: one thread per request, all at once, through the proxy.
PARALLEL = r"""
import base64, http.client, json, os, ssl, sys, threading, urllib.parse
count, method, path, port = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
credentials = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password)}"
results = []
def one():
    conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, timeout=60, context=ssl.create_default_context())
    conn.set_tunnel("apps.test", port, headers={"Proxy-Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()})
    conn.request(method, path, body="{}", headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    results.append({"status": response.status, "body": response.read().decode()})
threads = [threading.Thread(target=one) for _ in range(count)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"""


def pending_approval(session, timeout=60) -> ApprovalRequest:
    """The request parked, once the sandbox's program got it to the proxy: on a loaded
    machine (a CI run with other work beside it) that took more than 15 s once."""
    deadline = time.monotonic() + timeout
    while True:
        found = ApprovalRequest.objects.filter(
            session=session, status=ApprovalRequest.Status.PENDING
        ).first()
        if found:
            return found
        recorded = list(ApprovalRequest.objects.filter(session=session).values("status"))
        assert time.monotonic() < deadline, f"no pending approval request: {recorded}"
        time.sleep(0.05)


def decide(client, approval, decision):
    return client.post(
        f"/api/v1/approvals/{approval.pk}/decision/", {"decision": decision}, format="json"
    )


def test_auto_approve_gets_the_credential(session, owner, upstream_fakes):
    [result] = through_proxy(owner, [call("GET", REPO)], session=session)
    assert result["status"] == 200, result
    [received] = received_by_app(upstream_fakes)
    assert received["headers"]["authorization"] == f"Bearer {APP_TOKEN}"
    assert not ApprovalRequest.objects.exists()


def test_removing_a_credential_or_denying_an_action_reaches_the_proxy_at_once(
    session, owner, app, upstream_fakes
):
    from apps.models import AppAction, AppCredential

    AppCredential.objects.filter(app=app).delete()
    time.sleep(0.3)  # the proxy reloads on the change, not at its 2 s refresh
    [result] = through_proxy(owner, [call("GET", REPO)], session=session)
    assert result["status"] == 200
    assert "authorization" not in {
        k.lower() for k in received_by_app(upstream_fakes)[-1]["headers"]
    }
    action = AppAction.objects.get(app=app, key="repos.read")
    action.policy = "deny"
    action.save()
    time.sleep(0.3)
    [result] = through_proxy(owner, [call("GET", REPO)], session=session)
    assert error_code(result) == "apps.action_denied"


def test_deny_is_refused_at_once_and_nothing_reaches_the_app(session, owner, upstream_fakes):
    started = time.monotonic()
    [result] = through_proxy(owner, [call("DELETE", REPO)], session=session)
    assert result["status"] == 403
    assert error_code(result) == "apps.action_denied"
    assert "Do not retry" in json.loads(result["body"])["error"]["message"]
    assert time.monotonic() - started < 5
    assert received_by_app(upstream_fakes) == []


def test_ask_parks_shows_a_live_card_and_approval_forwards_exactly_once(
    session, owner, upstream_fakes, client_for, quor_web
):
    import websocket

    browser = Client()
    browser.force_login(owner)
    viewer = websocket.create_connection(
        f"ws://127.0.0.1:{PORTS.WEB}/ws/sessions/{session.pk}/?after=0",
        header=[f"Cookie: sessionid={browser.cookies['sessionid'].value}"],
        origin="http://localhost",
        timeout=15,
    )
    issue = '{"title": "Broken build", "body": "The tests fail."}'
    request = InBackground(
        owner, [call("POST", f"{REPO}/issues?access_token=abc", body=issue)], session
    )
    card = json.loads(viewer.recv())
    assert card["kind"] == "approval_requested"
    approval = card["payload"]["approval"]
    assert approval["app"] == "FakeHub"
    assert approval["method"] == "POST"
    assert approval["url"] == f"https://apps.test:{PORTS.TLS_APP}{REPO}/issues?access_token=***"
    assert [a["key"] for a in approval["actions"]] == ["issues.create"]
    assert approval["body_preview"] == issue  # what the user approves to send
    assert received_by_app(upstream_fakes) == []  # parked: nothing forwarded yet

    response = decide(
        client_for(owner), ApprovalRequest.objects.get(pk=approval["id"]), "approve_once"
    )
    assert response.status_code == 200, response.content
    [result] = request.wait()
    assert result["status"] == 200, result
    [received] = received_by_app(upstream_fakes)
    assert received["method"] == "POST"
    assert received["headers"]["authorization"] == f"Bearer {APP_TOKEN}"
    decided = json.loads(viewer.recv())
    assert decided["kind"] == "approval_decided"
    assert decided["payload"]["approval"]["status"] == "approved"
    viewer.close()

    # approve once means once: the next request asks again
    again = InBackground(owner, [call("POST", f"{REPO}/issues")], session)
    second = pending_approval(session)
    decide(client_for(owner), second, "reject")
    again.wait()


def test_reject_fails_closed_and_the_app_receives_nothing(
    session, owner, upstream_fakes, client_for
):
    request = InBackground(owner, [call("PUT", f"{REPO}/pulls/1/merge")], session)
    approval = pending_approval(session)
    assert decide(client_for(owner), approval, "reject").status_code == 200
    [result] = request.wait()
    assert result["status"] == 403
    assert error_code(result) == "approvals.rejected"
    assert received_by_app(upstream_fakes) == []


def test_an_unanswered_request_expires_and_fails_closed(session, owner, upstream_fakes, client_for):
    started = time.monotonic()
    [result] = through_proxy(owner, [call("PUT", f"{REPO}/pulls/2/merge")], session=session)
    waited = time.monotonic() - started
    assert result["status"] == 403
    assert error_code(result) == "approvals.expired"
    assert (
        settings.QUOR_APPROVAL_TIMEOUT_SECONDS - 1
        < waited
        < settings.QUOR_APPROVAL_TIMEOUT_SECONDS + 10
    )
    approval = ApprovalRequest.objects.get(session=session)
    assert (approval.status, approval.decided_via) == ("expired", "proxy")
    assert received_by_app(upstream_fakes) == []
    response = decide(client_for(owner), approval, "approve_once")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "approvals.already_decided"


def test_approve_for_the_session_lets_later_matching_requests_through_without_a_card(
    session, owner, upstream_fakes, client_for
):
    request = InBackground(owner, [call("POST", f"{REPO}/issues")], session)
    decide(client_for(owner), pending_approval(session), "approve_session")
    assert request.wait()[0]["status"] == 200
    started = time.monotonic()
    results = through_proxy(
        owner,
        [call("POST", f"{REPO}/issues"), call("POST", "/repos/acme/other/issues")],
        session=session,
    )
    assert [r["status"] for r in results] == [200, 200]
    assert time.monotonic() - started < 5
    assert ApprovalRequest.objects.filter(session=session).count() == 1
    assert len(received_by_app(upstream_fakes, "POST")) == 3
    # the grant covers that action only: another Ask action still parks
    other = InBackground(owner, [call("PUT", f"{REPO}/pulls/3/merge")], session)
    decide(client_for(owner), pending_approval(session), "reject")
    assert error_code(other.wait()[0]) == "approvals.rejected"


def test_an_app_not_selected_for_the_session_gets_no_credential(
    session, owner, org, upstream_fakes
):
    session.apps.clear()
    time.sleep(2.5)  # the proxy's snapshot of the session
    [result] = through_proxy(owner, [call("GET", REPO)], session=session)
    assert result["status"] == 200
    [received] = received_by_app(upstream_fakes)
    assert "authorization" not in {k.lower() for k in received["headers"]}


def test_a_scheduled_run_uses_its_preapprovals_and_never_waits(
    session, owner, app, org, upstream_fakes
):
    other = factories.make_app(
        org,
        name="Other",
        url_patterns=[f"https://apps.test:{PORTS.TLS_APP}/other"],
        credential="x" * 20,
    )
    session.apps.add(other)
    task = ScheduledTask.objects.create(
        owner=owner, name="Nightly", prompt="p", cron="0 3 * * *",
        model_provider=session.model_provider, model_name=session.model_name,
    )  # fmt: skip
    task.preapproved_apps.set([app])
    ScheduledRun.objects.create(
        task=task, scheduled_for="2026-01-01T03:00Z", session=session, status="running"
    )
    time.sleep(2.5)  # the proxy's snapshot of the session
    started = time.monotonic()
    results = through_proxy(
        owner,
        [call("POST", f"{REPO}/issues"), call("DELETE", REPO), call("GET", "/other/thing")],
        session=session,
    )
    assert results[0]["status"] == 200  # Ask of a pre-approved App
    assert error_code(results[1]) == "apps.action_denied"  # Deny beats pre-approval
    assert error_code(results[2]) == "apps.nobody_to_ask"  # Ask, not pre-approved
    assert time.monotonic() - started < 5
    assert not ApprovalRequest.objects.exists()


def test_a_parked_request_fails_closed_when_the_proxy_loses_redis(session, owner, upstream_fakes):
    request = InBackground(owner, [call("POST", f"{REPO}/issues")], session)
    approval = pending_approval(session)
    client = redis.Redis.from_url(settings.REDIS_URL)
    subscriptions = [  # this worker's: its processes use its Redis database
        c["id"] for c in client.client_list(_type="pubsub") if int(c["db"]) == REDIS_DATABASE
    ]
    assert sum(client.client_kill_filter(_id=id_) for id_ in subscriptions) >= 1
    [result] = request.wait()
    assert result["status"] == 403
    assert error_code(result) == "approvals.expired"
    approval.refresh_from_db()
    assert approval.status == "expired"
    assert received_by_app(upstream_fakes) == []


GIVE_UP = r"""
import base64, http.client, os, ssl, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
credentials = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password)}"
conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, timeout=2, context=ssl.create_default_context())
conn.set_tunnel("apps.test", int(sys.argv[1]), headers={"Proxy-Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()})
conn.request("POST", "/repos/acme/widgets/issues", body="{}")
try:
    conn.getresponse()
except TimeoutError:
    print("gave up")
conn.close()
"""


def test_a_request_whose_client_gave_up_is_never_sent(session, owner, upstream_fakes, client_for):
    run = services.sandbox_exec(
        user=owner,
        session=session,
        argv=["python3", "-c", GIVE_UP, str(PORTS.TLS_APP)],
        timeout_s=60,
    )
    assert run.stdout.decode().strip() == "gave up", run.stderr
    deadline = time.monotonic() + 10  # the proxy may still be parking it
    while not (approval := ApprovalRequest.objects.filter(session=session).first()):
        assert time.monotonic() < deadline, "the request was never parked"
        time.sleep(0.1)
    deadline = time.monotonic() + 5
    while approval.status == "pending":
        assert time.monotonic() < deadline, "the proxy did not notice the client left"
        time.sleep(0.1)
        approval.refresh_from_db()
    assert (approval.status, approval.decided_via) == ("expired", "proxy")
    assert decide(client_for(owner), approval, "approve_once").status_code == 409
    time.sleep(1)
    assert received_by_app(upstream_fakes) == []


def test_a_parked_request_dies_with_a_crashed_proxy_and_is_never_sent_later(
    session, owner, upstream_fakes, client_for, egress_proxy_process
):
    request = InBackground(owner, [call("POST", f"{REPO}/issues")], session)
    approval = pending_approval(session)
    egress_proxy_process.crash()
    [result] = request.wait()
    assert result["status"] is None, result  # the connection broke: nothing was answered
    egress_proxy_process.start()
    assert decide(client_for(owner), approval, "approve_once").status_code == 200
    [after] = through_proxy(owner, [call("GET", REPO)], session=session)
    assert after["status"] == 200, after  # the restarted proxy serves again
    time.sleep(1)
    assert [r["method"] for r in received_by_app(upstream_fakes)] == ["GET"]


def test_fifty_parked_requests_do_not_slow_other_traffic(session, owner, upstream_fakes):
    results = {}

    def park_fifty():
        run = services.sandbox_exec(
            user=owner,
            session=session,
            argv=["python3", "-c", PARALLEL, "50", "POST", f"{REPO}/issues", str(PORTS.TLS_APP)],
            timeout_s=120,
        )
        results["parked"] = json.loads(run.stdout)

    parking = threading.Thread(target=park_fifty)
    parking.start()
    deadline = time.monotonic() + 60
    while ApprovalRequest.objects.filter(session=session).count() < 50:
        assert time.monotonic() < deadline, "not every request was parked"
        time.sleep(0.2)
    started = time.monotonic()
    others = through_proxy(owner, [call("GET", REPO)] * 5, session=session)
    assert [r["status"] for r in others] == [200] * 5
    assert time.monotonic() - started < 3
    parking.join(60)
    codes = {json.loads(r["body"])["error"]["code"] for r in results["parked"]}
    assert codes == {"approvals.expired"}
    assert len(results["parked"]) == 50
    assert received_by_app(upstream_fakes, "POST") == []


def test_the_app_token_never_appears_inside_the_sandbox(session, owner, upstream_fakes):
    through_proxy(owner, [call("GET", REPO)], session=session)
    assert received_by_app(upstream_fakes)[0]["headers"]["authorization"].endswith(APP_TOKEN)
    assert places_holding(owner, APP_TOKEN) == []


def test_egress_check_reports_the_app_actions_policy_and_credential(session, owner, app, capsys):
    from django.core.management import call_command

    from apps.models import AppCredential

    def check(method, path):
        call_command(
            "egress_check", "--session", str(session.pk), "--method", method,
            f"https://apps.test:{PORTS.TLS_APP}{path}",
        )  # fmt: skip
        answer = json.loads(capsys.readouterr().out)
        return {**answer["app"], "top": (answer["decision"], answer["code"])}

    denied = check("DELETE", REPO)
    assert denied["top"] == ("blocked", "apps.action_denied")
    assert check("POST", f"{REPO}/issues")["top"] == ("ask", "")
    assert [a["key"] for a in denied["actions"]] == ["repos.delete"]
    assert (denied["policy"], denied["outcome"], denied["credential"]) == ("deny", "refuse", None)
    asked = check("POST", f"{REPO}/issues")
    assert (asked["policy"], asked["outcome"], asked["credential"]) == (
        "ask",
        "park",
        "organization",
    )
    AppCredential.objects.create(app=app, user=owner, secret="my-own-token-0123456789")
    assert check("GET", REPO)["credential"] == "user"
    assert check("GET", "/somewhere/else")["actions"][0]["key"] == "uncataloged"
    assert APP_TOKEN not in json.dumps(check("GET", REPO))
