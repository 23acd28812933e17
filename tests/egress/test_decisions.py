"""The egress decisions as tables: identity, destinations, requests, injection."""

import base64
import ipaddress

import pytest

from apps.policy import CREDENTIAL, Action, App, AppDecision
from egress.decisions import (
    CredentialRoute,
    EgressRules,
    Refusal,
    SandboxContext,
    app_credential,
    app_refusal,
    authenticate,
    check_request_target,
    decide_destination,
    prepare_request,
)

PLACEHOLDER = "quor-placeholder-0123456789abcdef0123456789abcdef"
ANTHROPIC = CredentialRoute("anthropic", "api.anthropic.com", 443, True, "x-api-key", "sk-ant-real")
OPENAI_NO_KEY = CredentialRoute("openai", "api.openai.com", 443, True, "authorization", None)
QUOR_API = CredentialRoute("quor_api", "10.0.0.5", 8000, False, "authorization", "qsb-real")
RULES = EgressRules(
    control_plane=("10.0.0.5", 8000),
    private_allowlist=frozenset({("gateway.internal", 8080)}),
    allowed_ports=frozenset({80, 443}),
)
DNS = {
    "example.com": ["93.184.216.34"],
    "api.anthropic.com": ["160.79.104.10"],
    "api.openai.com": ["162.159.140.245"],
    "internal.example.com": ["10.1.2.3"],
    "mixed.example.com": ["93.184.216.34", "127.0.0.1"],
    "v6-mapped.example.com": ["::ffff:169.254.169.254"],
    "gateway.internal": ["10.9.9.9"],
    "github.com": ["140.82.112.3"],
    "api.github.com": ["140.82.112.6"],
    "10.0.0.5": ["10.0.0.5"],
}


def resolve(host):
    if host not in DNS:
        raise LookupError("no such name")
    return [ipaddress.ip_address(a) for a in DNS[host]]


def context(**changes):
    fields = {
        "sandbox_id": "sbx-1",
        "user_id": 1,
        "organization_id": 1,
        "network_policy": "open",
        "placeholder": PLACEHOLDER,
        "proxy_tokens": {"sandbox": "diag-token", "s-abc": "session-token"},
        "routes": (QUOR_API, ANTHROPIC, OPENAI_NO_KEY),
    }
    return SandboxContext(**{**fields, **changes})


def basic(principal, token):
    return "Basic " + base64.b64encode(f"{principal}:{token}".encode()).decode()


def refusal_code(function, *args, **kwargs):
    with pytest.raises(Refusal) as excinfo:
        function(*args, **kwargs)
    return excinfo.value.status, excinfo.value.code


# --- identity -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (basic("sandbox", "diag-token"), "sandbox"),
        (basic("s-abc", "session-token"), "s-abc"),
    ],
)
def test_the_sandbox_and_its_sessions_authenticate_with_their_tokens(header, expected):
    assert authenticate(context(), header) == expected


@pytest.mark.parametrize(
    ("header", "status", "code"),
    [
        (None, 407, "egress.proxy_auth_required"),
        ("", 407, "egress.proxy_auth_required"),
        (basic("sandbox", "wrong"), 403, "egress.unidentified_session"),
        (basic("s-abc", "diag-token"), 403, "egress.unidentified_session"),
        (basic("s-other", "session-token"), 403, "egress.unidentified_session"),
        ("Bearer diag-token", 403, "egress.unidentified_session"),
        ("Basic !!!notbase64", 403, "egress.unidentified_session"),
    ],
)
def test_missing_or_foreign_proxy_credentials_are_refused(header, status, code):
    assert refusal_code(authenticate, context(), header) == (status, code)


def test_a_407_tells_the_client_how_to_authenticate():
    with pytest.raises(Refusal) as excinfo:
        authenticate(context(), None)
    assert excinfo.value.headers == {"Proxy-Authenticate": 'Basic realm="quor-egress"'}


# --- destinations -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "port", "code"),
    [
        ("internal.example.com", 443, "egress.private_destination"),
        ("mixed.example.com", 443, "egress.private_destination"),
        ("v6-mapped.example.com", 443, "egress.private_destination"),
        ("127.1", 80, "egress.private_destination"),
        ("0x7f000001", 80, "egress.private_destination"),
        ("2130706433", 80, "egress.private_destination"),
        ("0177.0.0.1", 80, "egress.private_destination"),
        ("[::1]", 80, "egress.private_destination"),
        ("[::ffff:127.0.0.1]", 80, "egress.private_destination"),
        ("169.254.169.254", 80, "egress.private_destination"),
        ("[64:ff9b::a9fe:a9fe]", 80, "egress.private_destination"),
        ("100.64.0.1", 80, "egress.private_destination"),
        ("10.0.0.5", 8001, "egress.private_destination"),
        ("nonexistent.example", 443, "egress.dns_failure"),
        ("example.com", 22, "egress.port_not_allowed"),
        ("bad host!", 443, "egress.invalid_destination"),
    ],
)
def test_non_global_and_unresolvable_destinations_are_blocked(host, port, code):
    assert refusal_code(decide_destination, context(), RULES, host, port, resolve)[1] == code


def test_a_public_https_destination_is_tunneled_to_the_checked_address():
    destination = decide_destination(context(), RULES, "example.com", 443, resolve)
    assert (destination.pinned_address, destination.intercept, destination.route) == (
        "93.184.216.34",
        False,
        None,
    )


def test_credentialed_https_hosts_are_intercepted():
    destination = decide_destination(context(), RULES, "API.Anthropic.com.", 443, resolve)
    assert destination.intercept is True
    assert destination.route == ANTHROPIC


def test_the_quor_api_is_allowed_despite_its_private_address_in_every_mode():
    for policy in ("open", "restricted", "deny"):
        destination = decide_destination(
            context(network_policy=policy), RULES, "10.0.0.5", 8000, resolve
        )
        assert destination.route == QUOR_API


def test_the_private_allowlist_names_exact_host_and_port():
    assert decide_destination(context(), RULES, "gateway.internal", 8080, resolve).addresses == (
        "10.9.9.9",
    )
    assert refusal_code(decide_destination, context(), RULES, "gateway.internal", 8081, resolve)[
        1
    ] == ("egress.private_destination")


@pytest.mark.parametrize(
    ("policy", "allow", "deny", "host", "allowed"),
    [
        ("open", (), (), "example.com", True),
        ("open", (), ("*.github.com", "github.com"), "api.github.com", False),
        ("open", (), ("*.github.com",), "github.com", True),
        ("open", ("github.com",), (), "example.com", False),
        ("open", ("github.com",), (), "github.com", True),
        ("restricted", (), (), "example.com", False),
        ("restricted", (), (), "api.anthropic.com", True),
        ("restricted", ("*.github.com",), (), "api.github.com", True),
        ("restricted", (), ("api.anthropic.com",), "api.anthropic.com", False),
        ("deny", ("github.com",), (), "github.com", False),
        ("deny", (), (), "api.anthropic.com", False),
    ],
)
def test_network_policy_and_domain_rules(policy, allow, deny, host, allowed):
    ctx = context(network_policy=policy, domain_allow=allow, domain_deny=deny)
    if allowed:
        assert decide_destination(ctx, RULES, host, 443, resolve).host == host
    else:
        assert (
            refusal_code(decide_destination, ctx, RULES, host, 443, resolve)[1]
            == "egress.policy_denied"
        )


# --- requests on a connection --------------------------------------------------------------


def test_a_kept_alive_plain_connection_cannot_switch_hosts():
    destination = decide_destination(context(), RULES, "example.com", 80, resolve)
    check_request_target(
        destination,
        request_host="example.com",
        request_port=80,
        host_header=None,
        intercepted=False,
    )
    assert refusal_code(
        check_request_target,
        destination,
        request_host="api.anthropic.com",
        request_port=80,
        host_header=None,
        intercepted=False,
    ) == (403, "egress.connection_reuse_refused")


@pytest.mark.parametrize(
    ("host_header", "ok"),
    [
        ("api.anthropic.com", True),
        ("api.anthropic.com:443", True),
        ("evil.example", False),
        (None, False),
    ],
)
def test_inside_intercepted_tls_the_host_header_must_be_the_connect_target(host_header, ok):
    destination = decide_destination(context(), RULES, "api.anthropic.com", 443, resolve)
    call = (check_request_target, destination)
    kwargs = {
        "request_host": None,
        "request_port": None,
        "host_header": host_header,
        "intercepted": True,
    }
    if ok:
        check_request_target(destination, **kwargs)
    else:
        assert refusal_code(*call, **kwargs) == (403, "egress.host_mismatch")


def test_the_placeholder_is_replaced_only_in_its_services_header():
    destination = decide_destination(context(), RULES, "api.anthropic.com", 443, resolve)
    prepared = prepare_request(
        context(), destination, {"x-api-key": PLACEHOLDER, "accept": "*/*"}, target="/v1/messages"
    )
    assert prepared.set_headers == {"x-api-key": "sk-ant-real"}
    assert prepared.credential_kind == "anthropic"


def test_the_quor_api_credential_keeps_its_scheme():
    destination = decide_destination(context(), RULES, "10.0.0.5", 8000, resolve)
    prepared = prepare_request(context(), destination, {"authorization": f"Bearer {PLACEHOLDER}"})
    assert prepared.set_headers == {"authorization": "Bearer qsb-real"}


@pytest.mark.parametrize(
    ("host", "headers", "target", "code"),
    [
        (
            "example.com",
            {"authorization": f"Bearer {PLACEHOLDER}"},
            "/",
            "egress.placeholder_misuse",
        ),
        (
            "api.anthropic.com",
            {"authorization": f"Bearer {PLACEHOLDER}"},
            "/",
            "egress.placeholder_misuse",
        ),
        ("api.anthropic.com", {}, f"/?key={PLACEHOLDER}", "egress.placeholder_misuse"),
        (
            "api.openai.com",
            {"authorization": f"Bearer {PLACEHOLDER}"},
            "/",
            "egress.credential_unavailable",
        ),
    ],
)
def test_placeholders_never_leave_with_the_request(host, headers, target, code):
    destination = decide_destination(context(), RULES, host, 443, resolve)
    assert refusal_code(prepare_request, context(), destination, headers, target=target)[1] == code


def test_requests_without_a_placeholder_pass_unchanged():
    destination = decide_destination(context(), RULES, "example.com", 443, resolve)
    prepared = prepare_request(context(), destination, {"authorization": "Bearer users-own-token"})
    assert prepared.set_headers == {}
    assert prepared.credential_kind is None


@pytest.mark.django_db
def test_old_egress_decisions_are_deleted_after_the_retention_period(settings):
    from datetime import timedelta

    from django.utils import timezone

    from egress.models import EgressDecision
    from egress.services import egress_decisions_delete_old

    now = timezone.now()
    old, recent = (
        EgressDecision.objects.create(
            created_at=now - timedelta(days=age),
            method="GET",
            host="example.com",
            outcome="forwarded",
        )
        for age in (settings.QUOR_EGRESS_AUDIT_RETENTION_DAYS + 1, 1)
    )
    assert egress_decisions_delete_old() == 1
    assert egress_decisions_delete_old() == 0
    # Its own rows: the test process's egress proxy, when an earlier test ran one, may
    # still be writing that test's decisions (in batches, after 0.5 s of quiet).
    remaining = EgressDecision.objects.filter(pk__in=[old.pk, recent.pk])
    assert list(remaining.values_list("pk", flat=True)) == [recent.pk]


def test_the_quor_api_alias_goes_to_the_real_api_address_with_its_credential():
    destination = decide_destination(context(), RULES, "quor-api", 80, resolve)
    assert (destination.host, destination.port, destination.route) == ("10.0.0.5", 8000, QUOR_API)
    check_request_target(
        destination, request_host="quor-api", request_port=80, host_header=None, intercepted=False
    )
    from egress.decisions import upstream_host_header

    assert upstream_host_header(destination) == "10.0.0.5:8000"


@pytest.mark.parametrize(
    ("host_header", "allowed"),
    [
        ("example.com", True),
        ("EXAMPLE.com:80", True),
        (None, True),
        ("elsewhere.example", False),
        ("example.com:8080", False),
    ],
)
def test_a_plain_http_host_header_must_name_the_urls_host(host_header, allowed):
    """Naming another site behind a shared front end (domain fronting) would reach it
    past the checks made of the URL's host."""
    destination = decide_destination(context(), RULES, "example.com", 80, resolve)

    def check():
        check_request_target(
            destination, request_host="example.com", request_port=80,
            host_header=host_header, intercepted=False,
        )  # fmt: skip

    if allowed:
        check()
    else:
        with pytest.raises(Refusal) as refused:
            check()
        assert refused.value.code == "egress.host_mismatch"


# --- App credentials and refusals ------------------------------------------------------------

HUB_TOKEN = "ghp_connected-0123456789"


def hub(style="bearer", header="authorization"):
    return App(7, "Hub", (), credential_style=style, credential_header=header)


def allowed(app, *action_names):
    actions = tuple(Action.build(f"a{i}", name, "auto") for i, name in enumerate(action_names))
    return AppDecision(CREDENTIAL, "apps.allowed", app=app, actions=actions)


@pytest.mark.parametrize(
    ("style", "header", "expected"),
    [
        ("bearer", "authorization", {"authorization": f"Bearer {HUB_TOKEN}"}),
        ("basic", "authorization", {"authorization": "Basic " + base64.b64encode(HUB_TOKEN.encode()).decode()}),
        ("header", "x-hub-token", {"x-hub-token": HUB_TOKEN}),
    ],
)  # fmt: skip
def test_a_connected_app_credential_goes_in_the_apps_own_header_style(style, header, expected):
    decision = allowed(hub(style, header))
    sandbox = context(app_credentials={7: (HUB_TOKEN, "user")})
    assert app_credential(sandbox, decision, {"authorization": "Bearer mine"}) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, {}),
        ({"authorization": "Bearer the-sandboxes-own"}, {}),
        ({"authorization": f"Bearer {PLACEHOLDER}"}, (403, "egress.credential_unavailable")),
        ({"x-hub-token": PLACEHOLDER}, (403, "egress.credential_unavailable")),
    ],
)
def test_without_a_connected_credential_a_request_goes_as_sent_unless_it_carries_the_placeholder(
    headers, expected
):
    app = hub("header", "x-hub-token") if "x-hub-token" in headers else hub()
    decision = allowed(app)
    if isinstance(expected, tuple):
        assert refusal_code(app_credential, context(), decision, headers) == expected
    else:
        assert app_credential(context(), decision, headers) == expected


@pytest.mark.parametrize(
    ("decision", "code", "message"),
    [
        (allowed(hub(), "Delete a repository"), "apps.action_denied",
         "Your organization does not allow Hub: Delete a repository. Do not retry; tell the user."),
        (allowed(hub()), "apps.not_selected",
         "Hub is not enabled for this session. The user can start a session with it."),
        (allowed(hub(), "Read", "Write"), "approvals.rejected",
         "The user rejected Hub: Read, Write. It was not sent; do not retry it, ask the user "
         "what to do instead."),
        (allowed(None), "approvals.expired",
         "Nobody approved this request in time. It was not sent; ask the user before trying "
         "again."),
    ],
    ids=["denied", "not selected", "rejected", "expired, no app"],
)  # fmt: skip
def test_an_app_refusal_tells_the_agent_which_app_and_actions_and_what_to_do(
    decision, code, message
):
    refusal = app_refusal(code, decision)
    assert (refusal.status, refusal.code, refusal.reason) == (403, code, message)
