"""The test OpenID Provider (tests/oidc_provider) does what the SSO tests rely on, shown
with a client written here by hand rather than Quor's."""

import base64
import hashlib
import secrets
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
import pytest
from joserfc import jwt
from joserfc.jwk import KeySet

from tests.oidc_provider import OpenIdProvider

REDIRECT_URI = "http://testserver/accounts/sso/callback/"
LOGGED_OUT_URI = "http://testserver/accounts/login/"
ALICE = {
    "email": "alice@acme.test",
    "email_verified": True,
    "name": "Alice Example",
    "groups": ["engineering", "quor-admins"],
    "quor_role": "admin",
}


@pytest.fixture(scope="module")
def provider():
    provider = OpenIdProvider(
        redirect_uris=[REDIRECT_URI], post_logout_redirect_uris=[LOGGED_OUT_URI]
    )
    provider.set_accounts({"alice": ALICE})
    yield provider
    provider.stop()


def metadata(provider):
    return httpx2.get(f"{provider.issuer}/.well-known/openid-configuration").json()


def authorization_request(provider, *, pkce=True, prompt=None):
    """An authorization URL as an RP builds it, and what the RP keeps for the callback."""
    request = {"state": secrets.token_urlsafe(), "nonce": secrets.token_urlsafe()}
    request["code_verifier"] = secrets.token_urlsafe(48)
    challenge = hashlib.sha256(request["code_verifier"].encode()).digest()
    params = {
        "response_type": "code",
        "client_id": provider.client_id,
        "redirect_uri": REDIRECT_URI,
        "scope": "openid email profile groups",
        "state": request["state"],
        "nonce": request["nonce"],
    }
    if pkce:
        params["code_challenge"] = base64.urlsafe_b64encode(challenge).rstrip(b"=").decode()
        params["code_challenge_method"] = "S256"
    if prompt:
        params["prompt"] = prompt
    request["url"] = f"{metadata(provider)['authorization_endpoint']}?{urlencode(params)}"
    return request


def callback_params(url):
    assert url.startswith(REDIRECT_URI), url
    return {name: values[0] for name, values in parse_qs(urlsplit(url).query).items()}


def sign_in(provider, login="alice", client_auth="client_secret_basic"):
    """Signs in through the OP and redeems the code: (token response, the request)."""
    request = authorization_request(provider)
    callback = callback_params(provider.authorize(request["url"], login))
    assert callback["state"] == request["state"]
    form = {
        "grant_type": "authorization_code",
        "code": callback["code"],
        "redirect_uri": REDIRECT_URI,
        "code_verifier": request["code_verifier"],
    }
    if client_auth == "client_secret_basic":
        auth = (provider.client_id, provider.client_secret)
    else:
        auth = None
        form.update(client_id=provider.client_id, client_secret=provider.client_secret)
    response = httpx2.post(metadata(provider)["token_endpoint"], data=form, auth=auth)
    assert response.status_code == 200, response.text
    return response.json(), request


def verified_id_token(provider, id_token, nonce):
    jwks = KeySet.import_key_set(httpx2.get(metadata(provider)["jwks_uri"]).json())
    token = jwt.decode(id_token, jwks, algorithms=["RS256"])
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": provider.issuer},
        aud={"essential": True, "value": provider.client_id},
        nonce={"essential": True, "value": nonce},
    ).validate(token.claims)
    return token


def test_discovery_names_the_issuer_and_pkce_s256(provider):
    document = metadata(provider)

    assert document["issuer"] == provider.issuer
    assert "S256" in document["code_challenge_methods_supported"]


@pytest.mark.parametrize("client_auth", ["client_secret_basic", "client_secret_post"])
def test_a_sign_in_gives_an_id_token_with_the_accounts_claims(provider, client_auth):
    tokens, request = sign_in(provider, client_auth=client_auth)

    token = verified_id_token(provider, tokens["id_token"], request["nonce"])
    assert token.claims["sub"] == "alice"
    assert {name: token.claims[name] for name in ALICE} == ALICE
    assert token.claims["exp"] - token.claims["iat"] == 600
    userinfo = httpx2.get(
        metadata(provider)["userinfo_endpoint"],
        headers={"Authorization": f"Bearer {tokens['access_token']}"},
    ).json()
    assert userinfo == {"sub": "alice", **ALICE}


def test_without_a_code_challenge_the_op_refuses(provider):
    request = authorization_request(provider, pkce=False)

    callback = callback_params(provider.authorize(request["url"], "alice"))

    assert callback["error"] == "invalid_request"
    assert "PKCE" in callback["error_description"]


def test_after_a_key_rotation_id_tokens_are_signed_with_the_new_key(provider):
    old_kids = {key["kid"] for key in httpx2.get(metadata(provider)["jwks_uri"]).json()["keys"]}

    provider.rotate_keys()

    kids = [key["kid"] for key in httpx2.get(metadata(provider)["jwks_uri"]).json()["keys"]]
    new_kid = kids[0]
    assert new_kid not in old_kids
    tokens, request = sign_in(provider)
    token = verified_id_token(provider, tokens["id_token"], request["nonce"])
    assert token.header["kid"] == new_kid


def test_rp_initiated_logout_ends_the_op_session(provider):
    tokens, _ = sign_in(provider)
    silent = authorization_request(provider, prompt="none")
    assert "code" in callback_params(provider.authorize(silent["url"], "alice"))
    logout = {
        "id_token_hint": tokens["id_token"],
        "post_logout_redirect_uri": LOGGED_OUT_URI,
        "state": "after-logout",
    }

    landed = provider.end_session(
        f"{metadata(provider)['end_session_endpoint']}?{urlencode(logout)}"
    )

    assert landed == f"{LOGGED_OUT_URI}?state=after-logout"
    silent = authorization_request(provider, prompt="none")
    assert callback_params(provider.authorize(silent["url"], "alice"))["error"] == "login_required"
