"""What a sign-in does with an ID token it must not trust: forged, expired, replayed, for
another client or from another issuer. A certified provider never sends those, so here
the provider is a loopback HTTP server that speaks OpenID Connect's wire format
(discovery, JWKS, token endpoint) and answers with whatever token a test builds."""

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey

from quor.models import AuditEntry, Membership, SingleSignOn, User
from quor.service_accounts import service_account_create
from tests import factories
from tests.oidc_provider import quor_link_to_provider

CLIENT_ID = "quor-test-client"
CLIENT_SECRET = "a-client-secret-of-forty-characters-0000"


class RogueProvider:
    """Discovery, JWKS and a token endpoint on loopback; `id_token` builds the token the
    next token request gets, from the nonce Quor sent to the authorization endpoint."""

    def __init__(self):
        self.key = RSAKey.generate_key(2048, parameters={"kid": "key-1"})
        self.token_error = None
        self.userinfo = None
        self.offered_algorithms = ["RS256", "HS256", "none"]
        self.endpoints = {}
        self.id_token = None
        self.token_requests = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, body, status=200):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/.well-known/openid-configuration":
                    self._json(provider.metadata())
                elif self.path == "/userinfo" and provider.userinfo is not None:
                    self._json(provider.userinfo)
                elif self.path == "/jwks":
                    self._json({"keys": [provider.key.as_dict(private=False)]})
                else:
                    self._json({"error": "not_found"}, 404)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                provider.token_requests += 1
                if provider.token_error:
                    self._json({"error": provider.token_error}, 400)
                    return
                self._json(
                    {
                        "access_token": "an-access-token",
                        "token_type": "Bearer",
                        "expires_in": 600,
                        "id_token": provider.id_token,
                    }
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.advertised_issuer = self.issuer
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metadata(self) -> dict:
        return {
            "issuer": self.advertised_issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": self.offered_algorithms,
            **({"userinfo_endpoint": f"{self.issuer}/userinfo"} if self.userinfo else {}),
            **self.endpoints,
        }

    def claims(self, sent_nonce: str, **overrides) -> dict:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": "subject-1",
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": sent_nonce,
            "email": "new.member@acme.test",
            "email_verified": True,
            "name": "New Member",
        }
        claims.update(overrides)
        return {name: value for name, value in claims.items() if value is not None}

    def signed(self, claims: dict, key=None) -> str:
        key = key or self.key
        return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def rogue_provider():
    provider = RogueProvider()
    yield provider
    provider.stop()


@pytest.fixture
def sso(org, rogue_provider):
    factories.make_verified_domain(org, "acme.test")
    return SingleSignOn.objects.create(
        organization=org,
        issuer=rogue_provider.issuer,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        creates_users=True,
    )


def start_sign_in(client) -> tuple[str, str]:
    """Starts a sign-in as a browser would; the (state, nonce) Quor sent."""
    response = client.post("/accounts/sso/", {"organization": "acme"})
    query = parse_qs(urlsplit(quor_link_to_provider(response)).query)
    assert query["code_challenge_method"] == ["S256"]
    return query["state"][0], query["nonce"][0]


def finish_sign_in(client, state: str):
    return client.get("/accounts/sso/callback/", {"code": "a-code", "state": state})


def assert_refused(response, reason: str, status: int = 400):
    assert response.status_code == status, response.content
    assert f'data-reason="{reason}"' in response.content.decode()
    assert "_auth_user_id" not in response.wsgi_request.session
    assert not User.objects.filter(email="new.member@acme.test").exists()
    assert AuditEntry.objects.filter(action="sso.refused", changes__reason=reason).exists()


def test_a_well_formed_id_token_signs_the_member_in(client, sso, rogue_provider):
    """The baseline the refusals below differ from by one thing each."""
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))

    response = finish_sign_in(client, state)

    assert response.status_code == 302
    user = User.objects.get(email="new.member@acme.test")
    assert client.session["_auth_user_id"] == str(user.pk)
    assert user.membership.role == Membership.Role.MEMBER
    assert not user.has_usable_password()


@pytest.mark.parametrize(
    ("overrides", "case"),
    [
        ({"iss": "https://evil.example"}, "another issuer"),
        ({"aud": "another-client"}, "another audience"),
        ({"exp": int(time.time()) - 600}, "expired"),
        ({"nonce": "not-the-nonce-quor-sent"}, "a nonce of another sign-in"),
        ({"nonce": None}, "no nonce"),
        ({"aud": "another-client", "azp": CLIENT_ID}, "another audience, Quor as azp"),
    ],
)
def test_an_id_token_with_a_wrong_claim_is_refused(client, sso, rogue_provider, overrides, case):
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce, **overrides))

    assert_refused(finish_sign_in(client, state), "id_token_invalid")


def test_an_id_token_signed_by_another_key_with_the_same_key_id_is_refused(
    client, sso, rogue_provider
):
    state, nonce = start_sign_in(client)
    forger = RSAKey.generate_key(2048, parameters={"kid": rogue_provider.key.kid})
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce), key=forger)

    assert_refused(finish_sign_in(client, state), "id_token_invalid")


def _unsigned(claims: dict) -> str:
    def encode(part):
        return base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()

    return f"{encode({'alg': 'none'})}.{encode(claims)}."


def test_an_unsigned_id_token_is_refused(client, sso, rogue_provider):
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = _unsigned(rogue_provider.claims(nonce))

    assert_refused(finish_sign_in(client, state), "id_token_invalid")


def test_an_id_token_signed_with_the_client_secret_is_refused(client, sso, rogue_provider):
    """HS256 with the client secret: anyone who learned the secret could mint one."""
    state, nonce = start_sign_in(client)
    secret = OctKey.import_key(CLIENT_SECRET)
    rogue_provider.id_token = jwt.encode({"alg": "HS256"}, rogue_provider.claims(nonce), secret)

    assert_refused(finish_sign_in(client, state), "id_token_invalid")


def test_a_replayed_callback_is_refused(client, sso, rogue_provider):
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))
    first = finish_sign_in(client, state)
    assert first.status_code == 302
    client.logout()

    replayed = finish_sign_in(client, state)

    assert replayed.status_code == 400
    assert 'data-reason="unknown_state"' in replayed.content.decode()
    assert "_auth_user_id" not in client.session
    assert rogue_provider.token_requests == 1


def test_a_callback_begun_in_another_browser_is_refused(client, sso, rogue_provider):
    """Login CSRF: an attacker's own authorization response, opened in the victim's
    browser, finds no sign-in under way there."""
    attacker = Client()
    state, nonce = start_sign_in(attacker)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))

    assert_refused(finish_sign_in(client, state), "unknown_state")
    assert rogue_provider.token_requests == 0


def test_a_refused_code_exchange_shows_a_clear_page(client, sso, rogue_provider):
    state, _ = start_sign_in(client)
    rogue_provider.token_error = "invalid_grant"

    response = finish_sign_in(client, state)

    assert_refused(response, "token_refused")
    assert "refused to complete the sign-in" in response.content.decode()


def test_the_provider_saying_no_shows_a_clear_page(client, sso, rogue_provider):
    state, _ = start_sign_in(client)

    response = client.get(
        "/accounts/sso/callback/",
        {"state": state, "error": "access_denied", "error_description": "User cancelled"},
    )

    assert_refused(response, "provider_error", status=403)
    assert "User cancelled" in response.content.decode()
    assert rogue_provider.token_requests == 0


def test_a_discovery_document_naming_another_issuer_is_refused(client, sso, rogue_provider):
    rogue_provider.advertised_issuer = "https://login.example"

    response = client.post("/accounts/sso/", {"organization": "acme"})

    assert response.status_code == 502
    assert 'data-reason="issuer_mismatch"' in response.content.decode()


def test_a_rotated_key_is_fetched_when_a_token_names_it(client, sso, rogue_provider):
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))
    assert finish_sign_in(client, state).status_code == 302
    client.logout()
    rogue_provider.key = RSAKey.generate_key(2048, parameters={"kid": "key-2"})

    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))

    assert finish_sign_in(client, state).status_code == 302
    assert "_auth_user_id" in client.session


@pytest.mark.parametrize("verified", [False, "true", None])
def test_an_email_not_said_to_be_verified_is_refused(client, sso, rogue_provider, verified):
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(
        rogue_provider.claims(nonce, email_verified=verified)
    )

    assert_refused(finish_sign_in(client, state), "email_not_verified", status=403)


def test_an_organization_may_accept_emails_its_provider_does_not_say_are_verified(
    client, sso, rogue_provider
):
    sso.require_verified_email = False
    sso.save()
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(
        rogue_provider.claims(nonce, email_verified=None)
    )

    assert finish_sign_in(client, state).status_code == 302


def test_the_id_tokens_claims_win_over_userinfo(client, sso, rogue_provider, colleague):
    rogue_provider.userinfo = {"sub": "subject-1", "email": colleague.email, "name": "Userinfo"}
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))

    assert finish_sign_in(client, state).status_code == 302

    user = User.objects.get(pk=client.session["_auth_user_id"])
    assert user.email == "new.member@acme.test"
    assert user.full_name == "New Member"


def test_userinfo_of_another_subject_is_refused(client, sso, rogue_provider):
    rogue_provider.userinfo = {"sub": "someone-else", "email": "new.member@acme.test"}
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))

    assert_refused(finish_sign_in(client, state), "userinfo_mismatch")


def test_service_accounts_and_superusers_cannot_sign_in(client, sso, rogue_provider, org):
    robot = service_account_create(organization=org, name="CI", scopes=["sessions"])
    root = factories.make_user(org, email="root@acme.test")
    root.is_superuser = True
    root.save()

    for email in (robot.user.email, root.email):
        state, nonce = start_sign_in(client)
        rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce, email=email))
        response = finish_sign_in(client, state)

        assert response.status_code == 403, email
        assert 'data-reason="not_a_person_of_the_organization"' in response.content.decode()
        assert "_auth_user_id" not in client.session


def test_another_account_of_the_provider_with_a_members_email_is_refused(
    client, sso, rogue_provider
):
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce))
    assert finish_sign_in(client, state).status_code == 302
    client.logout()

    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce, sub="subject-2"))
    response = finish_sign_in(client, state)

    assert response.status_code == 403
    assert 'data-reason="subject_changed"' in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize(
    ("endpoints", "algorithms"),
    [
        ({"token_endpoint": "https://10.1.2.3/token"}, ["RS256"]),
        ({"jwks_uri": "https://169.254.169.254/latest/meta-data/"}, ["RS256"]),
        ({"userinfo_endpoint": "http://example.com/userinfo"}, ["RS256"]),
        ({}, ["HS256", "none"]),
    ],
)
def test_a_provider_that_would_send_quor_inward_or_trust_no_key_is_refused(
    client, sso, rogue_provider, endpoints, algorithms
):
    rogue_provider.endpoints = endpoints
    rogue_provider.offered_algorithms = algorithms

    response = client.post("/accounts/sso/", {"organization": "acme"})

    assert response.status_code == 502
    assert 'data-reason="provider_misconfigured"' in response.content.decode()
    assert rogue_provider.token_requests == 0


def test_sign_in_creates_members_only_in_the_organizations_verified_domains(
    client, sso, rogue_provider
):
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(
        rogue_provider.claims(nonce, email="new.member@initech.test")
    )

    response = finish_sign_in(client, state)

    assert response.status_code == 403
    assert 'data-reason="no_account"' in response.content.decode()
    assert not User.objects.filter(email="new.member@initech.test").exists()


def refusal_of(response) -> str:
    page = response.content.decode()
    start = page.index('<p class="errors"')
    return page[start : page.index("</p>", start)]


def test_an_address_of_another_organization_reads_as_one_that_does_not_exist(
    client, sso, rogue_provider, stranger
):
    """The page and the audit entry Acme's people see are the same for an address Globex
    holds and for one nobody holds."""
    seen = []
    for email in (stranger.email, "nobody@globex.test"):
        state, nonce = start_sign_in(client)
        rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce, email=email))
        response = finish_sign_in(client, state)
        entry = AuditEntry.objects.filter(action="sso.refused").latest("id")
        seen.append(
            (
                response.status_code,
                refusal_of(response).replace(email, "EMAIL"),
                {**entry.changes, "email": "EMAIL"},
            )
        )

    assert seen[0] == seen[1]
    assert not User.objects.filter(email="nobody@globex.test").exists()


def test_an_unknown_organization_gets_a_clear_page(client, db):
    factories.make_org(name="Initech", slug="initech")

    response = client.post("/accounts/sso/", {"organization": "initech"})

    assert response.status_code == 404
    assert "no single sign-on" in response.content.decode()


# --- back-channel logout ---------------------------------------------------------------

LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"


@pytest.fixture
def signed_in(client, sso, rogue_provider):
    """A member signed in through the provider, in its session "sid-1"."""
    state, nonce = start_sign_in(client)
    rogue_provider.id_token = rogue_provider.signed(rogue_provider.claims(nonce, sid="sid-1"))
    assert finish_sign_in(client, state).status_code == 302
    return User.objects.get(email="new.member@acme.test")


def logout_claims(provider, **overrides) -> dict:
    claims = {
        "iss": provider.issuer,
        "aud": CLIENT_ID,
        "iat": int(time.time()),
        "jti": uuid.uuid4().hex,
        "sub": "subject-1",
        "sid": "sid-1",
        "events": {LOGOUT_EVENT: {}},
    }
    claims.update(overrides)
    return {name: value for name, value in claims.items() if value is not None}


def send_logout(client, token: str):
    return Client().post("/accounts/sso/back-channel-logout/", {"logout_token": token})


def is_signed_in(client) -> bool:
    return client.get("/account/tokens/").status_code == 200


def test_a_logout_token_from_the_provider_ends_that_sign_in_and_no_other(
    client, signed_in, rogue_provider
):
    password_browser = Client()
    password_browser.force_login(signed_in)

    response = send_logout(client, rogue_provider.signed(logout_claims(rogue_provider)))

    assert response.status_code == 200
    assert not is_signed_in(client)
    assert is_signed_in(password_browser)
    entry = AuditEntry.objects.get(action="sso.logout")
    assert entry.changes["sessions_ended"] == 1


def test_a_logout_token_of_another_provider_session_ends_nothing(client, signed_in, rogue_provider):
    response = send_logout(
        client, rogue_provider.signed(logout_claims(rogue_provider, sid="sid-2"))
    )

    assert response.status_code == 200
    assert is_signed_in(client)


@pytest.mark.parametrize(
    ("overrides", "case"),
    [
        ({"iss": "https://evil.example"}, "another issuer"),
        ({"aud": "another-client"}, "another audience"),
        ({"events": None}, "no logout event"),
        ({"events": {"http://example.com/other": {}}}, "another event"),
        ({"nonce": "n"}, "a nonce, as an ID token has"),
        ({"jti": None}, "no jti"),
        ({"sub": None}, "no subject"),
        ({"iat": int(time.time()) - 3600}, "issued an hour ago"),
    ],
)
def test_a_logout_token_with_a_wrong_claim_ends_nothing(
    client, signed_in, rogue_provider, overrides, case
):
    response = send_logout(
        client, rogue_provider.signed(logout_claims(rogue_provider, **overrides))
    )

    assert response.status_code == 400, case
    assert response.json()["error"] == "invalid_request"
    assert is_signed_in(client)
    assert not AuditEntry.objects.filter(action="sso.logout").exists()


def test_a_forged_or_unsigned_logout_token_ends_nothing(client, signed_in, rogue_provider):
    forger = RSAKey.generate_key(2048, parameters={"kid": rogue_provider.key.kid})

    forged = send_logout(client, rogue_provider.signed(logout_claims(rogue_provider), key=forger))
    unsigned = send_logout(client, _unsigned(logout_claims(rogue_provider)))
    garbage = send_logout(client, "not a token")

    assert [forged.status_code, unsigned.status_code, garbage.status_code] == [400, 400, 400]
    assert is_signed_in(client)


def test_a_replayed_logout_token_is_refused(client, signed_in, rogue_provider):
    token = rogue_provider.signed(logout_claims(rogue_provider))
    assert send_logout(client, token).status_code == 200

    assert send_logout(client, token).status_code == 400
