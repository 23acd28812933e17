"""The egress proxy from where an attacker stands: inside a real sandbox, as the
sandbox user, through the real proxy, to fakes on loopback."""

import json
import time

import pytest

from egress import proxy_plugin
from egress.models import EgressDecision
from quor.models import ModelProvider
from sandboxes.backends.docker import sandbox_network_gateway
from sandboxes.models import Sandbox
from sandboxes.runtime import services
from tests import factories
from tests.environment import PORTS, RUN_DIR

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

PROVIDER_KEY = "sk-ant-test-real-key-never-in-the-sandbox-0123456789"

# Runs inside the sandbox: sends requests through the proxy exactly as written
# (http.client does not rewrite hosts) and prints status and body of each.
CLIENT = r"""
import base64, http.client, json, os, socket, ssl, sys, time, urllib.parse
steps = json.loads(sys.argv[1])
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
def auth(step):
    user, password = step.get("as") or (urllib.parse.unquote(proxy.username), urllib.parse.unquote(proxy.password))
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
results, conn = [], None
for step in steps:
    headers = {k: os.path.expandvars(v) for k, v in step.get("headers", {}).items()}
    if step.get("auth", True):
        headers["Proxy-Authorization"] = auth(step)
    started = time.monotonic()
    try:
        if step.get("tunnel"):
            host, port = step["tunnel"]
            conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, timeout=20, context=ssl.create_default_context())
            conn.set_tunnel(host, port, headers={"Proxy-Authorization": headers.pop("Proxy-Authorization")} if "Proxy-Authorization" in headers else None)
        elif not (step.get("reuse") and conn):
            conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=20)
        conn.request(step.get("method", "GET"), step["url"], body=step.get("body"), headers=headers)
        response = conn.getresponse()
        results.append({"status": response.status, "body": response.read().decode(errors="replace"), "seconds": time.monotonic() - started})
    except OSError as exc:  # http.client reports a refused CONNECT this way
        status = int(str(exc).split()[3]) if str(exc).startswith("Tunnel connection failed") else None
        results.append({"status": status, "error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - started})
print(json.dumps(results))
"""


def through_proxy(user, steps, *, session=None):
    result = services.sandbox_exec(
        user=user, session=session, argv=["python3", "-c", CLIENT, json.dumps(steps)], timeout_s=120
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


FIND_SECRET = r"""
echo "$1" | base64 -d > /dev/shm/needle
grep -rlF -f /dev/shm/needle /workspace /home /tmp /run /opt /etc /usr/local 2>/dev/null
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -qF -f /dev/shm/needle "$f" 2>/dev/null && echo "$f"; done
ps auxww | grep -qF -f /dev/shm/needle && echo "process list"
rm /dev/shm/needle
"""


def places_holding(user, secret: str) -> list[str]:
    """Where, inside the sandbox, the secret can be read by the sandbox user (the
    search never puts the secret itself on a command line)."""
    import base64

    encoded = base64.b64encode(secret.encode()).decode()
    result = services.sandbox_exec(user=user, argv=["sh", "-c", FIND_SECRET, "find", encoded])
    return result.stdout.decode().split()


def wait_for_decision(**filters) -> EgressDecision:
    """The audit log is written in batches by the proxy; wait a little for it."""
    deadline = time.monotonic() + 5
    while not (found := EgressDecision.objects.filter(**filters).order_by("-created_at").first()):
        assert time.monotonic() < deadline, f"no egress decision {filters} was recorded"
        time.sleep(0.2)
    return found


def error_code(result):
    return json.loads(result["body"])["error"]["code"]


@pytest.fixture
def provider(org):
    return factories.make_provider(
        org,
        kind=ModelProvider.Kind.ANTHROPIC,
        base_url=f"https://provider.test:{PORTS.PROVIDER}",
        api_key=PROVIDER_KEY,
        model_names=["claude-test"],
    )


@pytest.fixture
def sandbox(owner, provider, egress_proxy, clean_runtimes):
    return services.sandbox_ensure(user=owner)


def test_an_ordinary_request_is_forwarded_without_the_proxy_credentials(
    sandbox, owner, upstream_fakes
):
    [result] = through_proxy(owner, [{"url": f"http://app.test:{PORTS.APP}/hello"}])
    assert result["status"] == 200, result
    received = upstream_fakes.app.requests[-1]
    assert received["path"] == "/hello"
    assert "Proxy-Authorization" not in received["headers"]
    assert "via" not in {name.lower() for name in received["headers"]}


# {app}: the fake App's port, {gateway}: the host on the sandboxes' bridge (test ids are
# the same in every test process).
@pytest.mark.parametrize(
    "url",
    [
        "http://private.test:{app}/",
        "http://metadata.test/",
        "http://mixed.test/",
        "http://127.1:{app}/",
        "http://0x7f000001:{app}/",
        "http://2130706433:{app}/",
        "http://0177.0.0.1:{app}/",
        "http://[::1]:{app}/",
        "http://[::ffff:127.0.0.1]:{app}/",
        "http://169.254.169.254/latest/meta-data/",
        "http://{gateway}:5432/",
        "http://nonexistent.test/",
    ],
)
def test_internal_destinations_are_blocked_whatever_the_spelling(sandbox, owner, url):
    url = url.format(app=PORTS.APP, gateway=sandbox_network_gateway())
    [result] = through_proxy(owner, [{"url": url}])
    assert result["status"] == 403, result
    assert error_code(result) in ("egress.private_destination", "egress.dns_failure")


def test_the_provider_key_is_injected_and_never_reaches_the_sandbox(sandbox, owner, upstream_fakes):
    before = len(upstream_fakes.provider.requests)
    [result] = through_proxy(owner, [{
        "tunnel": ["provider.test", PORTS.PROVIDER], "url": "/v1/messages", "method": "POST",
        "headers": {"x-api-key": "$ANTHROPIC_API_KEY", "content-type": "application/json"},
        "body": "{}",
    }])  # fmt: skip
    assert result["status"] == 200, result
    [received] = upstream_fakes.provider.requests[before:]
    assert received["headers"]["x-api-key"] == PROVIDER_KEY
    assert PROVIDER_KEY not in result["body"]
    sandbox.refresh_from_db()
    assert (
        services.sandbox_exec(user=owner, argv=["printenv", "ANTHROPIC_API_KEY"])
        .stdout.decode()
        .strip()
        == sandbox.placeholder
    )
    assert places_holding(owner, PROVIDER_KEY) == []
    decision = wait_for_decision(credential_kind="anthropic")
    assert decision.outcome == EgressDecision.Outcome.INJECTED
    assert decision.sandbox_id == sandbox.pk


def test_a_placeholder_sent_elsewhere_is_refused_and_recorded(sandbox, owner, upstream_fakes):
    before = len(upstream_fakes.app.requests)
    [result] = through_proxy(
        owner,
        [{"url": f"http://app.test:{PORTS.APP}/", "headers": {"x-api-key": "$ANTHROPIC_API_KEY"}}],
    )
    assert result["status"] == 403
    assert error_code(result) == "egress.placeholder_misuse"
    assert len(upstream_fakes.app.requests) == before
    decision = wait_for_decision(code="egress.placeholder_misuse")
    assert (decision.outcome, decision.host, decision.port) == ("blocked", "app.test", PORTS.APP)


def test_a_missing_credential_fails_closed(sandbox, owner, provider, upstream_fakes):
    ModelProvider.objects.filter(pk=provider.pk).update(api_key="")
    time.sleep(2.5)  # the proxy's directory refreshes every 2 s
    before = len(upstream_fakes.provider.requests)
    [result] = through_proxy(
        owner,
        [
            {
                "tunnel": ["provider.test", PORTS.PROVIDER],
                "url": "/v1/messages",
                "headers": {"x-api-key": "$ANTHROPIC_API_KEY"},
            }
        ],
    )
    assert result["status"] == 403
    assert error_code(result) == "egress.credential_unavailable"
    assert len(upstream_fakes.provider.requests) == before


def test_a_kept_alive_connection_cannot_switch_hosts(sandbox, owner, upstream_fakes):
    before = len(upstream_fakes.app.requests)
    first, second = through_proxy(owner, [
        {"url": f"http://app.test:{PORTS.APP}/first"},
        {"url": f"http://other.test:{PORTS.APP}/second", "reuse": True},
    ])  # fmt: skip
    assert first["status"] == 200
    assert second["status"] == 403
    assert error_code(second) == "egress.connection_reuse_refused"
    assert [r["path"] for r in upstream_fakes.app.requests[before:]] == ["/first"]


def test_inside_intercepted_tls_the_host_header_must_match(sandbox, owner, upstream_fakes):
    before = len(upstream_fakes.provider.requests)
    [result] = through_proxy(
        owner,
        [
            {
                "tunnel": ["provider.test", PORTS.PROVIDER],
                "url": "/",
                "headers": {"Host": "app.test"},
            }
        ],
    )
    assert result["status"] == 403
    assert error_code(result) == "egress.host_mismatch"
    assert len(upstream_fakes.provider.requests) == before


def test_the_quor_api_gets_the_sandbox_credential_and_the_session(sandbox, owner):
    session = factories.make_session(owner, sandbox=sandbox)
    steps = [
        {
            "url": "http://quor-api/api/v1/runtime/whoami/",
            "headers": {"Authorization": "Bearer $QUOR_API_TOKEN"},
        }
    ]
    [result] = through_proxy(owner, steps, session=session)
    assert result["status"] == 200, result
    assert json.loads(result["body"]) == {
        "sandbox": str(sandbox.pk),
        "user": owner.email,
        "session": str(session.pk),
    }
    [anonymous] = through_proxy(owner, [{"url": steps[0]["url"]}])
    assert anonymous["status"] == 401


def test_the_quor_credential_is_revoked_when_the_sandbox_is_destroyed(sandbox, owner):
    sandbox.refresh_from_db()
    credential = sandbox.runtime_credential
    services.sandbox_destroy(sandbox=sandbox)
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    assert client.get("/api/v1/runtime/whoami/").status_code == 401


def test_a_sandbox_cannot_use_another_sandboxs_or_sessions_credentials(
    sandbox, owner, org, egress_proxy
):
    neighbour = factories.make_user(org, email="neighbour@acme.test")
    other = services.sandbox_ensure(user=neighbour)
    other_session = factories.make_session(neighbour, sandbox=other)
    results = through_proxy(owner, [
        {"url": f"http://app.test:{PORTS.APP}/", "as": ["sandbox", other.proxy_token]},
        {"url": f"http://app.test:{PORTS.APP}/", "as": [f"s-{other_session.pk}", other_session.proxy_token]},
        {"url": f"http://app.test:{PORTS.APP}/", "auth": False},
    ])  # fmt: skip
    assert [r["status"] for r in results] == [403, 403, 407]
    assert [error_code(r) for r in results] == [
        "egress.unidentified_session",
        "egress.unidentified_session",
        "egress.proxy_auth_required",
    ]


def test_requests_from_addresses_that_are_no_sandbox_are_refused(egress_proxy):
    import urllib.error
    import urllib.request

    host, port = egress_proxy
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": f"http://{host}:{port}"})
    )
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        opener.open(f"http://app.test:{PORTS.APP}/", timeout=10)
    assert excinfo.value.code == 403
    assert json.loads(excinfo.value.read())["error"]["code"] == "egress.unidentified_sandbox"


@pytest.mark.parametrize(
    ("policy", "app_status", "provider_status"),
    [("open", 200, 200), ("restricted", 403, 200), ("deny", 403, 403)],
)
def test_network_policies(sandbox, owner, policy, app_status, provider_status):
    Sandbox.objects.filter(pk=sandbox.pk).update(network_policy=policy)
    time.sleep(2.5)
    app, provider_result, api = through_proxy(owner, [
        {"url": f"http://app.test:{PORTS.APP}/"},
        {"tunnel": ["provider.test", PORTS.PROVIDER], "url": "/", "headers": {"x-api-key": "$ANTHROPIC_API_KEY"}},
        {"url": "http://quor-api/api/v1/runtime/whoami/", "headers": {"Authorization": "Bearer $QUOR_API_TOKEN"}},
    ])  # fmt: skip
    assert (app["status"], provider_result["status"], api["status"]) == (
        app_status,
        provider_status,
        200,
    )


def test_the_proxy_connects_to_the_address_it_checked_with_one_lookup(
    sandbox, owner, upstream_fakes
):
    answers = iter([["127.0.0.2"], ["127.0.0.1"], ["127.0.0.1"], ["127.0.0.1"]])
    upstream_fakes.dns.records["rebind.test"] = lambda: next(answers)
    upstream_fakes.dns.ttls["rebind.test"] = 0  # a rebinding name: its answers are not kept
    upstream_fakes.dns.queries["rebind.test"] = 0
    [result] = through_proxy(owner, [{"url": f"http://rebind.test:{PORTS.APP}/pinned"}])
    assert json.loads(result["body"])["server"] == "app-127.0.0.2"
    assert upstream_fakes.dns.queries["rebind.test"] == 2  # one lookup: A and AAAA


def test_a_silent_client_does_not_stall_others(sandbox, owner):
    stall = r"""
import base64, os, socket, sys, time, urllib.parse, http.client
provider_port, app_port = sys.argv[1:]
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = base64.b64encode(f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password)}".encode()).decode()
silent = []
for _ in range(3):
    s = socket.create_connection((proxy.hostname, proxy.port))
    s.sendall(f"CONNECT provider.test:{provider_port} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
    silent.append(s)  # then never a TLS ClientHello
time.sleep(1)
started = time.monotonic()
conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=10)
conn.request("GET", f"http://app.test:{app_port}/fast", headers={"Proxy-Authorization": "Basic " + auth})
print(conn.getresponse().status, round(time.monotonic() - started, 3))
"""
    result = services.sandbox_exec(
        user=owner, argv=["python3", "-c", stall, str(PORTS.PROVIDER), str(PORTS.APP)], timeout_s=60
    )
    status, seconds = result.stdout.decode().split()
    assert status == "200"
    assert float(seconds) < 2


def test_a_sandbox_silent_after_connect_to_an_intercepted_host_is_dropped(sandbox, owner):
    """Without a deadline the proxy's blocking handshake would hold a thread for ever."""
    silent = r"""
import base64, os, socket, sys, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = base64.b64encode(f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password)}".encode()).decode()
s = socket.create_connection((proxy.hostname, proxy.port))
s.sendall(f"CONNECT provider.test:{sys.argv[1]} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
s.settimeout(40)
started, answer = time.monotonic(), b""
try:
    while chunk := s.recv(4096):
        answer += chunk
except OSError:
    pass
print(answer.split(b"\r\n")[0].decode(), "|", round(time.monotonic() - started, 1))
"""
    result = services.sandbox_exec(
        user=owner, argv=["python3", "-c", silent, str(PORTS.PROVIDER)], timeout_s=60
    )
    status_line, seconds = result.stdout.decode().rsplit("|", 1)
    assert " 200 " in status_line, result
    assert proxy_plugin.SANDBOX_HANDSHAKE_TIMEOUT_S - 1 < float(seconds) < 30


def test_oversized_bodies_are_refused_with_413(sandbox, owner):
    [result] = through_proxy(owner, [{
        "url": f"http://app.test:{PORTS.APP}/upload", "method": "POST",
        "headers": {"Content-Length": str(40 * 1024 * 1024)}, "body": "x",
    }])  # fmt: skip
    assert result["status"] == 413
    assert error_code(result) == "egress.body_too_large"


def test_the_sandbox_trusts_the_quor_ca_but_never_holds_its_key(sandbox, owner):
    from django.conf import settings

    from egress.ca import ensure_ca

    files = ensure_ca(settings.QUOR_EGRESS_CA_DIR)
    key_line = files.key.read_text().splitlines()[1]
    bundle = services.sandbox_exec(
        user=owner, argv=["cat", "/etc/ssl/certs/ca-certificates.crt"]
    ).stdout.decode()
    assert files.cert_pem().strip() in bundle
    # Every file the sandbox user can read; the kernel's pseudo-files hold no file of
    # Quor's and some of them block a reader forever.
    skip = ["--devices=skip", "--exclude-dir=proc", "--exclude-dir=sys"]
    search = services.sandbox_exec(
        user=owner, argv=["grep", "-rlsF", *skip, "--", key_line, "/"], timeout_s=60
    )
    assert not search.timed_out, "the search did not finish: it proves nothing"
    assert search.stdout == b""


def test_an_upstream_that_never_answers_tls_does_not_stall_others(
    sandbox, owner, org, upstream_fakes
):
    factories.make_provider(
        org,
        kind=ModelProvider.Kind.OPENAI,
        base_url=f"https://silent.test:{PORTS.SILENT}",
        api_key="sk-x",
    )
    time.sleep(2.5)
    script = r"""
import base64, http.client, os, ssl, sys, threading, time, urllib.parse
silent_port, app_port = sys.argv[1:]
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = "Basic " + base64.b64encode(f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password)}".encode()).decode()
def hang():
    conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, timeout=30, context=ssl.create_default_context())
    conn.set_tunnel("silent.test", int(silent_port), headers={"Proxy-Authorization": auth})
    try:
        conn.request("GET", "/")
    except Exception:
        pass
for _ in range(3):
    threading.Thread(target=hang, daemon=True).start()
time.sleep(1)
started = time.monotonic()
conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=10)
conn.request("GET", f"http://app.test:{app_port}/fast", headers={"Proxy-Authorization": auth})
print(conn.getresponse().status, round(time.monotonic() - started, 3))
"""
    result = services.sandbox_exec(
        user=owner, argv=["python3", "-c", script, str(PORTS.SILENT), str(PORTS.APP)], timeout_s=60
    )
    status, seconds = result.stdout.decode().split()
    assert status == "200"
    assert float(seconds) < 2
    assert len(upstream_fakes.silent.held) >= 3  # the proxy really was stuck upstream


def test_egress_check_reports_the_decision_the_proxy_would_take(sandbox, owner, capsys):
    from django.core.management import call_command

    for url, expected in [
        (
            f"https://provider.test:{PORTS.PROVIDER}/v1/messages",
            {"decision": "intercept", "credential": "anthropic"},
        ),
        (f"http://app.test:{PORTS.APP}/", {"decision": "forward", "credential": None}),
        ("http://private.test/", {"decision": "blocked", "code": "egress.private_destination"}),
    ]:
        call_command("egress_check", "--user", owner.email, url)
        answer = json.loads(capsys.readouterr().out)
        assert {k: answer[k] for k in expected} == expected, answer
    assert PROVIDER_KEY not in json.dumps(answer)


def test_the_proxy_reports_ready_once_it_knows_the_sandboxes(egress_proxy, capsys):
    from django.core.management import call_command

    deadline = time.monotonic() + 10
    while True:
        try:
            call_command("egress_ready")
            break
        except SystemExit:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    assert (
        f"egress proxy: ready on {sandbox_network_gateway()}:{PORTS.EGRESS_PROXY}"
        in capsys.readouterr().out
    )


def test_the_proxy_logs_never_contain_a_credential(sandbox, owner, upstream_fakes):

    through_proxy(
        owner,
        [
            {
                "tunnel": ["provider.test", PORTS.PROVIDER],
                "url": "/v1/messages",
                "headers": {"x-api-key": "$ANTHROPIC_API_KEY"},
            }
        ],
    )
    assert upstream_fakes.provider.requests[-1]["headers"]["x-api-key"] == PROVIDER_KEY
    log = (RUN_DIR / "egress-proxy.log").read_text()
    assert PROVIDER_KEY not in log
    sandbox.refresh_from_db()
    assert sandbox.proxy_token not in log


# Runs inside the sandbox: sends each case's requests byte for byte on one connection
# (a {"tls": host} step wraps it, after a CONNECT) and prints status and code of each,
# and after a refusal whether the proxy closed the connection (or reset it).
RAW_CLIENT = r"""
import base64, http.client, json, os, socket, ssl, sys, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = base64.b64encode(f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password)}".encode()).decode()
results = []
for case in json.loads(sys.argv[1]):
    answers = []
    try:
        sock = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
        for step in case:
            if "tls" in step:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=step["tls"])
                continue
            started = time.monotonic()
            sock.sendall(step["send"].replace("{auth}", auth).encode("latin-1"))
            response = http.client.HTTPResponse(sock)
            response.begin()
            tunnel = step["send"].startswith("CONNECT") and response.status == 200
            body = b"" if tunnel else response.read()
            try:
                code = json.loads(body)["error"]["code"]
            except (ValueError, KeyError, TypeError):  # not a refusal's JSON
                code = None
            answer = {"status": response.status, "code": code, "type": response.getheader("content-type"), "seconds": time.monotonic() - started}
            if not tunnel and response.status != 200:  # a refusal: how the proxy left the connection
                sock.settimeout(5)
                try:
                    answer["connection"] = "closed" if sock.recv(1) == b"" else "open"
                except ssl.SSLEOFError:  # closed under TLS without a close_notify
                    answer["connection"] = "closed"
                except ConnectionResetError:
                    answer["connection"] = "reset"
                except TimeoutError:
                    answer["connection"] = "open"
            answers.append(answer)
        sock.close()
    except (OSError, http.client.HTTPException) as exc:
        answers.append({"status": None, "error": f"{type(exc).__name__}: {exc}"})
    results.append(answers)
print(json.dumps(results))
"""

AUTH = "Proxy-Authorization: Basic {auth}\r\n"


def get(
    target: str, host: str = f"app.test:{PORTS.APP}", *, auth: str = AUTH, version: str = "HTTP/1.1"
):
    return {"send": f"GET {target} {version}\r\nHost: {host}\r\n{auth}\r\n"}


def connect(authority: str):
    return {"send": f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{AUTH}\r\n"}


INVALID_DESTINATION = (400, "egress.invalid_destination")
INVALID_PORT = (400, "egress.invalid_port")
INVALID_SCHEME = (400, "egress.invalid_scheme")
MALFORMED = (400, "egress.malformed_request")
HOST_MISMATCH = (403, "egress.host_mismatch")
OK = (200, None)

# Each case: the requests sent on one connection, and the answer to each.
MALFORMED_REQUESTS = [
    ([get("http://425.510.425.510/")], [INVALID_DESTINATION]),
    ([get("http://7147006462/")], [INVALID_DESTINATION]),
    ([get("http://0x41414141A9FEA9FE/")], [INVALID_DESTINATION]),
    ([get("http://[::1/")], [INVALID_DESTINATION]),
    ([get(f"http://[fe80::1%25eth0]:{PORTS.APP}/")], [INVALID_DESTINATION]),
    ([get(f"http://::1:{PORTS.APP}/")], [INVALID_DESTINATION]),
    ([get(f"http://user:secret@app.test:{PORTS.APP}/")], [INVALID_DESTINATION]),
    ([get(f"http://app.test:{PORTS.APP}@private.test/")], [INVALID_DESTINATION]),
    ([get("http://" + "a" * 64 + ".test/")], [INVALID_DESTINATION]),
    ([get("http://exa%20mple.test/")], [INVALID_DESTINATION]),
    ([get("http://127.0.0.1:+80/")], [INVALID_PORT]),
    ([get("http://app.test:-1/")], [INVALID_PORT]),
    ([get("http://app.test:0/")], [INVALID_PORT]),
    ([get("http://app.test:65536/")], [INVALID_PORT]),
    ([get(f"http://app.test:{PORTS.APP}x/")], [INVALID_PORT]),
    ([get("http://app.test:1_8080/")], [INVALID_PORT]),
    ([get("http://app.test:/")], [INVALID_PORT]),
    ([get(f"ftp://app.test:{PORTS.APP}/")], [INVALID_SCHEME]),
    ([get(f"https://app.test:{PORTS.APP}/")], [INVALID_SCHEME]),
    ([get(f"app.test:{PORTS.APP}")], [INVALID_SCHEME]),
    ([get("/hello")], [MALFORMED]),
    ([get(f"//app.test:{PORTS.APP}/hello")], [MALFORMED]),
    ([get(f"http://app.test:{PORTS.APP}/", version="HTTP/9.9")], [MALFORMED]),
    ([{"send": f"GET http://app.test:{PORTS.APP}/\r\n{AUTH}\r\n"}], [MALFORMED]),  # no version
    ([get("http://\xff.test/")], [MALFORMED]),
    ([get(f"http://app.test:{PORTS.APP}/a\x01b")], [MALFORMED]),
    ([connect("provider.test")], [INVALID_PORT]),
    ([connect("provider.test:99999")], [INVALID_PORT]),
    ([connect("0x41414141A9FEA9FE:443")], [INVALID_DESTINATION]),
    ([connect(f"user@provider.test:{PORTS.PROVIDER}")], [INVALID_DESTINATION]),
    ([connect("[::1:443")], [INVALID_DESTINATION]),
    ([get(f"http://app.test:{PORTS.APP}/", host="app.test:+80")], [INVALID_PORT]),
    ([get(f"http://app.test:{PORTS.APP}/", host="exa mple.test")], [INVALID_DESTINATION]),
    # on a kept-alive connection, and inside intercepted TLS
    ([get(f"http://app.test:{PORTS.APP}/first"), get("http://app.test:+80/")], [OK, INVALID_PORT]),
    ([get(f"http://app.test:{PORTS.APP}/first"), get("/second")], [OK, MALFORMED]),
    (
        [
            connect(f"provider.test:{PORTS.PROVIDER}"),
            {"tls": "provider.test"},
            get("/", "provider.test:+1"),
        ],
        [OK, INVALID_PORT],
    ),
    (  # a URL inside intercepted TLS would be judged as plain http, past the App's rules
        [
            connect(f"provider.test:{PORTS.PROVIDER}"),
            {"tls": "provider.test"},
            get(f"http://provider.test:{PORTS.PROVIDER}/", f"other.test:{PORTS.APP}"),
        ],
        [OK, MALFORMED],
    ),
    # who asks is checked first
    ([get("http://app.test:+80/", auth="")], [(407, "egress.proxy_auth_required")]),
    # what follows the authority's end cannot move the host
    ([get(f"http://app.test:{PORTS.APP}#@private.test/")], [OK]),
    # nor can the Host header (domain fronting)
    (
        [get(f"http://app.test:{PORTS.APP}/fronted", host=f"other.test:{PORTS.APP}")],
        [HOST_MISMATCH],
    ),
]


def test_malformed_hosts_ports_and_schemes_get_a_json_refusal_from_the_proxy(
    sandbox, owner, upstream_fakes
):

    log = RUN_DIR / "egress-proxy.log"
    log_start = log.stat().st_size
    app_before, provider_before = (
        len(upstream_fakes.app.requests),
        len(upstream_fakes.provider.requests),
    )
    cases = [steps for steps, _ in MALFORMED_REQUESTS]
    result = services.sandbox_exec(
        user=owner, argv=["python3", "-c", RAW_CLIENT, json.dumps(cases)], timeout_s=120
    )
    assert result.exit_code == 0, result.stderr
    answers = json.loads(result.stdout)
    request_lines = [
        " | ".join(step.get("send", "").split("\r\n")[0] for step in steps) for steps in cases
    ]
    got = [
        (line, [(a.get("status"), a.get("code") or a.get("error")) for a in answer])
        for line, answer in zip(request_lines, answers, strict=True)
    ]
    assert got == [
        (line, expected)
        for line, (_, expected) in zip(request_lines, MALFORMED_REQUESTS, strict=True)
    ]
    for answer in answers:
        for step in answer:
            assert step["seconds"] < 5, answer
            if step["status"] != 200:
                assert step["type"] == "application/json", answer
    received = upstream_fakes.app.requests[app_before:]
    assert [r["path"] for r in received] == ["/first", "/first", "/"]
    assert len(upstream_fakes.provider.requests) == provider_before
    decision = wait_for_decision(code="egress.invalid_port", sandbox_id=sandbox.pk)
    assert decision.outcome == EgressDecision.Outcome.BLOCKED
    assert "Traceback" not in log.read_bytes()[log_start:].decode(errors="replace")


def send_raw(owner, cases: list[list[dict]]) -> list[list[dict]]:
    """The answers to each case's requests, sent byte for byte from inside the sandbox."""
    result = services.sandbox_exec(
        user=owner, argv=["python3", "-c", RAW_CLIENT, json.dumps(cases)], timeout_s=120
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def wait_for_refusals(sandbox, count: int) -> list[tuple[str, str]]:
    """The (code, path) of the sandbox's recorded refusals, once there are `count`."""
    deadline = time.monotonic() + 5
    while True:
        blocked = EgressDecision.objects.filter(
            sandbox_id=sandbox.pk, outcome=EgressDecision.Outcome.BLOCKED
        ).order_by("created_at")
        if len(blocked) >= count or time.monotonic() > deadline:
            sandbox.refresh_from_db()
            assert {d.client_address for d in blocked} <= {sandbox.network_address}
            return sorted((d.code, d.path) for d in blocked)
        time.sleep(0.2)


MALFORMED_HEADER = "Content-Length: not-a-number\r\n"


def test_a_malformed_header_on_a_kept_alive_connection_gets_a_400_and_a_clean_close(
    sandbox, owner, upstream_fakes
):
    log = RUN_DIR / "egress-proxy.log"
    log_start = log.stat().st_size
    before = len(upstream_fakes.app.requests)
    bad = get(f"http://app.test:{PORTS.APP}/malformed", auth=AUTH + MALFORMED_HEADER)
    inner_bad = get(
        "/malformed-inside-tls", f"provider.test:{PORTS.PROVIDER}", auth=MALFORMED_HEADER
    )
    answers = send_raw(owner, [
        [get(f"http://app.test:{PORTS.APP}/first"), bad],
        [connect(f"provider.test:{PORTS.PROVIDER}"), {"tls": "provider.test"},
         get("/first", f"provider.test:{PORTS.PROVIDER}", auth=""), inner_bad],
    ])  # fmt: skip
    refused = (400, "egress.malformed_request", "application/json", "closed")
    assert [
        [(a.get("status"), a.get("code"), a.get("type"), a.get("connection")) for a in answer][-1]
        for answer in answers
    ] == [refused, refused], answers
    assert [a["status"] for answer in answers for a in answer[:-1]] == [200, 200, 200], answers
    assert [r["path"] for r in upstream_fakes.app.requests[before:]] == ["/first"]
    assert wait_for_refusals(sandbox, 2) == [
        ("egress.malformed_request", "/malformed"),
        ("egress.malformed_request", "/malformed-inside-tls"),
    ]
    assert "Traceback" not in log.read_bytes()[log_start:].decode(errors="replace")


def test_refusals_proxy_py_makes_before_the_plugin_runs_are_recorded_like_the_plugins(
    sandbox, owner, upstream_fakes
):
    too_large = {
        "send": f"POST http://app.test:{PORTS.APP}/too-large HTTP/1.1\r\n{AUTH}"
        f"Content-Length: {40 * 1024 * 1024}\r\n\r\nxx"
    }
    answers = send_raw(owner, [
        [get("/not-a-proxy-request")],
        [get(f"http://app.test:{PORTS.APP}/unknown-version", version="HTTP/9.9")],
        [{"send": "NOT A REQUEST LINE AT ALL\r\n\r\n"}],
        [get(f"http://app.test:{PORTS.APP}/first-malformed", auth=AUTH + MALFORMED_HEADER)],
        [too_large],
        [get(f"http://app.test:{PORTS.APP}/first"), too_large],
    ])  # fmt: skip
    assert [
        (a["status"], a["code"], a.get("connection")) for answer in answers for a in answer
    ] == [
        (400, "egress.malformed_request", "closed"),
        (400, "egress.malformed_request", "closed"),
        (400, "egress.malformed_request", "closed"),
        (400, "egress.malformed_request", "closed"),
        (413, "egress.body_too_large", "closed"),
        (200, None, None),
        (413, "egress.body_too_large", "closed"),
    ], answers
    assert wait_for_refusals(sandbox, 6) == sorted(
        [
            ("egress.malformed_request", "/not-a-proxy-request"),
            ("egress.malformed_request", "/unknown-version"),
            ("egress.malformed_request", ""),
            ("egress.malformed_request", "/first-malformed"),
            ("egress.body_too_large", "/too-large"),
            ("egress.body_too_large", "/too-large"),
        ]
    )
