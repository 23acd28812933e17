"""Abuse controls: password logins locked after repeated failures (per account and per
address), and API rate limits per token and per organization (429 with Retry-After).
Counts live in the tests' Redis; each test starts with none (tests/conftest.py)."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from quor import service_accounts
from quor.lib import login_attempts, throttling
from quor.lib.login_attempts import client_address
from quor.models import AuditEntry
from sandboxes.models import Sandbox, hash_token, new_secret_token
from tests import factories

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
LOCKED = "Too many failed login attempts"
OPERATOR_TOKEN = "operator-token-0123456789-abcdefghijklmnop"


def log_in(email, password, address="10.0.0.1", path=LOGIN):
    """A fresh browser's login attempt: (its response, whether it is now signed in)."""
    browser = Client(REMOTE_ADDR=address)
    response = browser.post(path, {"username": email, "password": password})
    return response, "_auth_user_id" in browser.session


def fail(email, times, address="10.0.0.1"):
    for _ in range(times):
        _, signed_in = log_in(email, "wrong-password", address)
        assert not signed_in


# --- login ---------------------------------------------------------------------------------


def test_the_sixth_attempt_within_the_window_is_refused_even_with_the_right_password(owner):
    fail(owner.email, 5)
    response, signed_in = log_in(owner.email, factories.PASSWORD)
    assert not signed_in
    assert LOCKED in response.content.decode()


def test_below_the_limit_the_right_password_still_logs_in(owner):
    fail(owner.email, 4)
    response, signed_in = log_in(owner.email, factories.PASSWORD)
    assert signed_in and response.status_code == 302


def test_a_locked_account_reads_the_same_whatever_the_password(owner):
    fail(owner.email, 5)
    wrong, _ = log_in(owner.email, "wrong-password")
    right, _ = log_in(owner.email, factories.PASSWORD)
    assert LOCKED in error_of(wrong)
    assert (wrong.status_code, error_of(wrong)) == (right.status_code, error_of(right))


def error_of(response) -> str:
    page = response.content.decode()
    start = page.index('<p class="errors"')
    return page[start : page.index("</p>", start)]


def test_an_account_locked_from_one_address_stays_locked_from_another(owner):
    fail(owner.email, 5, address="10.0.0.1")
    response, signed_in = log_in(owner.email, factories.PASSWORD, address="10.9.9.9")
    assert not signed_in
    assert LOCKED in response.content.decode()


def test_the_email_is_counted_whatever_its_case(owner):
    fail(owner.email.upper(), 5)
    _, signed_in = log_in(owner.email, factories.PASSWORD)
    assert not signed_in


def test_the_lockout_says_how_long_it_lasts(settings, owner):
    settings.QUOR_LOGIN_LOCKOUT_SECONDS = 120
    fail(owner.email, 5)
    response, _ = log_in(owner.email, factories.PASSWORD)
    assert "Try again in 2 minutes." in response.content.decode()


def test_a_successful_login_clears_the_accounts_failures(owner):
    fail(owner.email, 4)
    assert log_in(owner.email, factories.PASSWORD)[1]
    fail(owner.email, 4)
    assert log_in(owner.email, factories.PASSWORD)[1]


def test_one_address_trying_many_accounts_is_locked_out_then_every_account(
    settings, owner, colleague
):
    settings.QUOR_LOGIN_MAX_FAILURES_PER_ADDRESS = 3
    for email in ("colleague@acme.test", "nobody@acme.test", "stranger@globex.test"):
        fail(email, 1, address="10.6.6.6")
    response, signed_in = log_in(owner.email, factories.PASSWORD, address="10.6.6.6")
    assert not signed_in and LOCKED in response.content.decode()
    assert log_in(owner.email, factories.PASSWORD, address="10.0.0.2")[1]


def test_unknown_accounts_are_locked_like_known_ones():
    fail("nobody@acme.test", 5)
    response, _ = log_in("nobody@acme.test", "anything")
    assert LOCKED in response.content.decode()


def test_a_lockout_is_in_the_organizations_audit_log_once(owner, org):
    fail(owner.email, 5, address="10.0.0.7")
    fail(owner.email, 3, address="10.0.0.7")  # refused while locked: not another lockout
    [entry] = AuditEntry.objects.filter(action="login.locked_out")
    assert entry.organization == org
    assert entry.target_id == str(owner.pk)
    assert entry.changes["locked"] == "account"
    assert entry.changes["address"] == "10.0.0.7"
    assert entry.changes["failures"] == 5


def test_an_unknown_accounts_lockout_is_audited_for_superusers_only():
    fail("nobody@acme.test", 5)
    [entry] = AuditEntry.objects.filter(action="login.locked_out")
    assert entry.organization is None and entry.target_id == ""
    assert entry.changes["email"] == "nobody@acme.test"


def test_attempts_refused_during_a_lockout_do_not_count_towards_the_next(settings, owner):
    settings.QUOR_LOGIN_MAX_FAILURES_PER_ADDRESS = 2
    fail("nobody@acme.test", 2, address="10.6.6.6")  # the address is locked
    fail(owner.email, 5, address="10.6.6.6")  # refused: the owner's account is not touched
    assert log_in(owner.email, factories.PASSWORD, address="10.0.0.2")[1]


def test_the_admin_login_is_locked_too(org_admin):
    assert log_in(org_admin.email, factories.PASSWORD, path="/admin/login/")[1]
    fail(org_admin.email, 5)
    response, signed_in = log_in(org_admin.email, factories.PASSWORD, path="/admin/login/")
    assert response.status_code == 200 and not signed_in


def test_zero_turns_the_account_limit_off(settings, owner):
    settings.QUOR_LOGIN_MAX_FAILURES_PER_ACCOUNT = 0
    fail(owner.email, 8)
    assert log_in(owner.email, factories.PASSWORD)[1]


def test_behind_trusted_proxies_the_address_the_first_one_saw_counts(settings, rf):
    request = rf.post(
        LOGIN, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.9, 10.1.1.1"
    )
    settings.QUOR_TRUSTED_PROXY_COUNT = 0
    assert client_address(request) == "127.0.0.1"
    settings.QUOR_TRUSTED_PROXY_COUNT = 1
    assert client_address(request) == "10.1.1.1"
    settings.QUOR_TRUSTED_PROXY_COUNT = 2
    assert client_address(request) == "203.0.113.9"  # not the entry the client wrote


# --- sign-in rate limits ------------------------------------------------------------------


def sign_in_requests(address):
    """One anonymous request to each way of signing in, from `address`."""
    browser = Client(REMOTE_ADDR=address)
    return [
        browser.post(LOGIN, {"username": "a@acme.test", "password": "x"}),
        browser.post("/admin/login/", {"username": "b@acme.test", "password": "x"}),
        browser.post("/accounts/sso/", {"organization": "acme"}),
        browser.get("/accounts/sso/callback/", {"state": "s", "code": "c"}),
    ]


def test_an_address_beyond_the_sign_in_limit_is_told_when_to_come_back(settings, owner):
    settings.QUOR_SIGN_IN_RATE_LIMIT_PER_ADDRESS = 4
    assert all(r.status_code != 429 for r in sign_in_requests("10.0.0.7"))
    for refused in sign_in_requests("10.0.0.7"):
        assert refused.status_code == 429, refused.request
        assert 1 <= int(refused["Retry-After"]) <= settings.QUOR_SIGN_IN_RATE_WINDOW_SECONDS
        assert "Too many sign-in attempts" in refused.content.decode()
    response, signed_in = log_in(owner.email, factories.PASSWORD, address="10.0.0.7")
    assert response.status_code == 429 and not signed_in
    assert log_in(owner.email, factories.PASSWORD, address="10.0.0.8")[1]


def test_an_account_beyond_the_sign_in_limit_is_refused_from_every_address(settings, owner):
    settings.QUOR_SIGN_IN_RATE_LIMIT_PER_ACCOUNT = 2
    assert log_in(owner.email, factories.PASSWORD, address="10.0.1.1")[1]
    assert log_in(owner.email, factories.PASSWORD, address="10.0.1.2")[1]
    response, signed_in = log_in(owner.email.upper(), factories.PASSWORD, address="10.0.1.3")
    assert response.status_code == 429 and not signed_in
    assert log_in("colleague@acme.test", "wrong", address="10.0.1.3")[0].status_code == 200


def test_viewing_the_login_page_is_not_a_sign_in_attempt(settings):
    settings.QUOR_SIGN_IN_RATE_LIMIT_PER_ADDRESS = 1
    browser = Client(REMOTE_ADDR="10.0.0.9")
    assert {browser.get(LOGIN).status_code for _ in range(3)} == {200}


# --- API rate limits -----------------------------------------------------------------------


@pytest.fixture
def limits(settings):
    """Small limits, so that a test reaches them in a few requests."""

    def set_limits(per_token=1000, per_organization=1000):
        settings.QUOR_API_RATE_LIMIT_PER_TOKEN = per_token
        settings.QUOR_API_RATE_LIMIT_PER_ORGANIZATION = per_organization

    return set_limits


def test_a_token_beyond_its_limit_gets_429_with_retry_after_in_the_error_shape(
    limits, client_for, owner
):
    limits(per_token=3)
    api = client_for(owner)
    assert [api.get("/api/v1/me/").status_code for _ in range(3)] == [200, 200, 200]
    refused = api.get("/api/v1/me/")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    error = refused.json()["error"]
    assert error["code"] == "throttled"
    assert "this token" in error["message"] and "at most 3 in 60 s" in error["message"]


def test_each_token_is_counted_on_its_own(limits, client_for, owner):
    limits(per_token=2)
    first, second = client_for(owner), client_for(owner)
    assert [first.get("/api/v1/me/").status_code for _ in range(3)] == [200, 200, 429]
    assert second.get("/api/v1/me/").status_code == 200


def test_a_browser_session_is_counted_per_user(limits, owner, colleague):
    limits(per_token=2)
    browser = APIClient()
    browser.force_login(owner)
    assert [browser.get("/api/v1/me/").status_code for _ in range(3)] == [200, 200, 429]
    again = APIClient()
    again.force_login(owner)  # another session of the same user: the same count
    assert again.get("/api/v1/me/").status_code == 429
    other = APIClient()
    other.force_login(colleague)
    assert other.get("/api/v1/me/").status_code == 200


def test_a_service_account_token_is_counted_on_its_own(limits, client_for, org, owner):
    limits(per_token=2)
    account = service_accounts.service_account_create(
        organization=org, name="CI", scopes=["sessions"]
    )
    _, raw_token = service_accounts.service_account_token_create(account=account)
    ci = APIClient()
    ci.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
    assert [ci.get("/api/v1/sessions/").status_code for _ in range(3)] == [200, 200, 429]
    assert client_for(owner).get("/api/v1/me/").status_code == 200


def test_an_organization_is_limited_across_its_members_and_no_other(
    limits, client_for, owner, colleague, stranger
):
    limits(per_organization=4)
    owners, colleagues = client_for(owner), client_for(colleague)
    assert [owners.get("/api/v1/me/").status_code for _ in range(2)] == [200, 200]
    assert [colleagues.get("/api/v1/me/").status_code for _ in range(2)] == [200, 200]
    refused = owners.get("/api/v1/me/")
    assert refused.status_code == 429 and "Retry-After" in refused
    assert "your organization" in refused.json()["error"]["message"]
    assert client_for(stranger).get("/api/v1/me/").status_code == 200


def test_refused_requests_do_not_count(limits, client_for, owner, colleague):
    limits(per_token=2, per_organization=3)
    owners = client_for(owner)
    assert [owners.get("/api/v1/me/").status_code for _ in range(5)] == [200, 200, 429, 429, 429]
    assert client_for(colleague).get("/api/v1/me/").status_code == 200  # the org's 3rd


def test_the_sandbox_runtime_and_the_operator_api_are_not_limited(limits, settings, owner, org):
    limits(per_token=1, per_organization=1)
    credential = new_secret_token()
    Sandbox.objects.create(user=owner, runtime_credential_hash=hash_token(credential))
    runtime = APIClient()
    runtime.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    assert {runtime.get("/api/v1/runtime/whoami/").status_code for _ in range(3)} == {200}
    settings.QUOR_OPERATOR_TOKEN = OPERATOR_TOKEN
    operator = APIClient()
    operator.credentials(HTTP_AUTHORIZATION=f"Bearer {OPERATOR_TOKEN}")
    statuses = {operator.get("/api/operator/v1/organizations/").status_code for _ in range(3)}
    assert statuses == {200}


def test_zero_turns_the_api_limits_off(limits, client_for, owner):
    limits(per_token=0, per_organization=0)
    api = client_for(owner)
    assert {api.get("/api/v1/me/").status_code for _ in range(5)} == {200}


# --- without Redis -------------------------------------------------------------------------


@pytest.fixture
def redis_unreachable(settings):
    """Nothing listens on port 1: every command fails to connect."""
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    caches = (
        throttling.redis_client,
        throttling._take_script,
        login_attempts._record_failure_script,
    )
    for cached in caches:
        cached.cache_clear()
    yield
    for cached in caches:
        cached.cache_clear()


def test_without_redis_logins_and_api_requests_go_through(
    redis_unreachable, limits, client_for, owner
):
    limits(per_token=1, per_organization=1)
    fail(owner.email, 6)
    assert log_in(owner.email, factories.PASSWORD)[1]
    api = client_for(owner)
    assert {api.get("/api/v1/me/").status_code for _ in range(3)} == {200}
