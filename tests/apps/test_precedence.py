"""The App policy precedence, as a table: every combination the issue names."""

import itertools

import pytest

from apps.policy import (
    ANY_REQUEST,
    ASK,
    AUTO,
    CREDENTIAL,
    DENY,
    FORWARD,
    PARK,
    REFUSE,
    UNCATALOGED,
    Action,
    App,
    AppIndex,
    SessionApps,
    decide_app_request,
    parse_url_pattern,
)

APP_ID = 7


def make_app(policies, *, custom=False, deny_when_not_selected=False):
    """An App whose actions all match GET /things, one per policy given."""
    actions = tuple(
        Action.build(f"a{i}", f"Action {i}", policy, ["GET"], ["/things"])
        for i, policy in enumerate(policies)
    )
    return App(
        app_id=APP_ID,
        name="Things",
        url_patterns=(parse_url_pattern("https://things.test"),),
        actions=() if custom else actions,
        custom=custom,
        deny_when_not_selected=deny_when_not_selected,
    )


def decide(app, session, target="/things"):
    return decide_app_request(
        AppIndex([app]),
        session,
        method="GET",
        scheme="https",
        host="things.test",
        port=443,
        target=target,
    )


SELECTED = SessionApps(selected=frozenset({APP_ID}))
NOT_SELECTED = SessionApps(selected=frozenset())


def grant(*keys):
    return SessionApps(selected=frozenset({APP_ID}), grants=frozenset((APP_ID, k) for k in keys))


def unattended(*, preapproved):
    return SessionApps(
        selected=frozenset({APP_ID}),
        preapproved=frozenset({APP_ID}) if preapproved else frozenset(),
    )


# (matched policies, session, expected outcome, expected reason)
TABLE = [
    # one matched action, interactive session that selected the App
    ([AUTO], SELECTED, CREDENTIAL, "auto_approved"),
    ([ASK], SELECTED, PARK, "ask"),
    ([DENY], SELECTED, REFUSE, "apps.action_denied"),
    # several matched actions: the strictest wins
    ([AUTO, ASK], SELECTED, PARK, "ask"),
    ([ASK, AUTO], SELECTED, PARK, "ask"),
    ([AUTO, DENY], SELECTED, REFUSE, "apps.action_denied"),
    ([ASK, DENY], SELECTED, REFUSE, "apps.action_denied"),
    ([AUTO, ASK, DENY], SELECTED, REFUSE, "apps.action_denied"),
    ([AUTO, AUTO], SELECTED, CREDENTIAL, "auto_approved"),
    ([ASK, ASK], SELECTED, PARK, "ask"),
    # uncataloged request to a built-in App: Ask
    ([], SELECTED, PARK, "ask"),
    # session grants
    ([ASK], grant("a0"), CREDENTIAL, "session_grant"),
    ([ASK], grant("other"), PARK, "ask"),
    ([ASK, ASK], grant("a0"), PARK, "ask"),  # a grant must cover every Ask action
    ([ASK, ASK], grant("a0", "a1"), CREDENTIAL, "session_grant"),
    ([AUTO, ASK], grant("a1"), CREDENTIAL, "session_grant"),
    ([DENY], grant("a0"), REFUSE, "apps.action_denied"),  # Deny over a grant
    ([], grant(UNCATALOGED), CREDENTIAL, "session_grant"),
    # unattended scheduled runs
    ([ASK], unattended(preapproved=True), CREDENTIAL, "preapproved"),
    ([ASK], unattended(preapproved=False), REFUSE, "apps.nobody_to_ask"),
    ([], unattended(preapproved=True), CREDENTIAL, "preapproved"),
    ([], unattended(preapproved=False), REFUSE, "apps.nobody_to_ask"),
    ([AUTO], unattended(preapproved=False), CREDENTIAL, "auto_approved"),
    ([DENY], unattended(preapproved=True), REFUSE, "apps.action_denied"),  # Deny over pre-approval
    ([ASK, DENY], unattended(preapproved=True), REFUSE, "apps.action_denied"),
    # the App is not selected for the session (or there is no session)
    ([AUTO], NOT_SELECTED, FORWARD, "not_selected"),
    ([ASK], NOT_SELECTED, FORWARD, "not_selected"),
    ([DENY], NOT_SELECTED, REFUSE, "apps.action_denied"),
    ([AUTO], None, FORWARD, "not_selected"),
]


@pytest.mark.parametrize(("policies", "session", "outcome", "reason"), TABLE)
def test_the_strictest_rule_decides_a_request(policies, session, outcome, reason):
    decision = decide(make_app(policies), session)
    assert (decision.outcome, decision.reason) == (outcome, reason)


@pytest.mark.parametrize(
    ("session", "outcome", "reason"),
    [
        (SELECTED, PARK, "ask"),
        (
            SessionApps(selected=frozenset({APP_ID}), grants=frozenset({(APP_ID, ANY_REQUEST)})),
            CREDENTIAL,
            "session_grant",
        ),
        (unattended(preapproved=True), CREDENTIAL, "preapproved"),
        (unattended(preapproved=False), REFUSE, "apps.nobody_to_ask"),
        (NOT_SELECTED, FORWARD, "not_selected"),
    ],
)
def test_every_request_to_a_custom_app_is_ask(session, outcome, reason):
    decision = decide(make_app([], custom=True), session)
    assert decision.actions[0].key == ANY_REQUEST
    assert (decision.outcome, decision.reason) == (outcome, reason)


def test_an_app_can_deny_requests_from_sessions_that_did_not_select_it():
    app = make_app([AUTO], deny_when_not_selected=True)
    assert decide(app, NOT_SELECTED).reason == "apps.not_selected"
    assert decide(app, SELECTED).outcome == CREDENTIAL


@pytest.mark.parametrize(
    "target",
    [
        "/things/../things",
        "/./things",
        "//things",
        "/things%2F",
        "/th%2fings",
        "/a/%2e%2e/things",
        "/things;x=1",
        "/things%3Bx",
    ],
)
def test_a_non_canonical_path_to_an_app_is_refused(target):
    decision = decide(make_app([AUTO]), SELECTED, target=target)
    assert (decision.outcome, decision.reason) == (REFUSE, "apps.noncanonical_path")


@pytest.mark.parametrize("target", ["/THINGS", "/things/", "/things?x=1", "/th%69ngs"])
def test_case_trailing_slash_query_and_escapes_do_not_dodge_an_action(target):
    assert decide(make_app([DENY]), SELECTED, target=target).reason == "apps.action_denied"


def test_a_url_no_app_owns_is_an_ordinary_request():
    app = make_app([DENY])
    for host, port, scheme in [
        ("other.test", 443, "https"),
        ("things.test", 8443, "https"),
        ("things.test", 443, "http"),
        ("xthings.test", 443, "https"),
    ]:
        decision = decide_app_request(
            AppIndex([app]),
            SELECTED,
            method="GET",
            scheme=scheme,
            host=host,
            port=port,
            target="/things",
        )
        assert (decision.outcome, decision.app) == (FORWARD, None)


def test_wildcard_hosts_and_base_paths_attribute_requests():
    jira = App(
        1,
        "Jira",
        (parse_url_pattern("https://*.atlassian.net"),),
        (Action.build("delete", "Delete", DENY, ["DELETE"], ["/rest/api/3/issue/{key}"]),),
    )
    ghe = App(
        2,
        "GHE",
        (parse_url_pattern("https://git.corp.test/api/v3"),),
        (Action.build("delete", "Delete", DENY, ["DELETE"], ["/repos/{o}/{r}"]),),
    )
    index = AppIndex([jira, ghe])
    session = SessionApps(selected=frozenset({1, 2}))

    def run(host, target, method="DELETE"):
        return decide_app_request(
            index, session, method=method, scheme="https", host=host, port=443, target=target
        )

    assert run("acme.atlassian.net", "/rest/api/3/issue/K-1").reason == "apps.action_denied"
    assert run("atlassian.net", "/rest/api/3/issue/K-1").app is None
    assert run("git.corp.test", "/api/v3/repos/o/r").reason == "apps.action_denied"
    assert run("git.corp.test", "/api/v3x/repos/o/r").app is None
    assert run("git.corp.test", "/repos/o/r").app is None


def test_every_policy_combination_follows_deny_then_ask_then_auto():
    for size in (1, 2, 3):
        for policies in itertools.product([AUTO, ASK, DENY], repeat=size):
            decision = decide(make_app(list(policies)), SELECTED)
            strictest = DENY if DENY in policies else ASK if ASK in policies else AUTO
            expected = {DENY: REFUSE, ASK: PARK, AUTO: CREDENTIAL}[strictest]
            assert decision.outcome == expected, policies
            assert decision.policy == strictest
