"""Single sign-on in a real browser: from Quor's login page to a certified OpenID
Provider (panva's oidc-provider on loopback, tests/oidc_provider/), through its login
and consent pages, back to Quor signed in; and out again through the provider."""

from urllib.parse import urlsplit

import pytest

from tests.ui.conftest import QUOR, assert_accessible

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("viewport", ["desktop"])  # the phone's menu is another test's
def test_a_person_signs_in_through_the_provider_and_out_again(
    ui,
    sso,
    openid_provider,
):
    openid_provider.set_accounts(
        {"grace": {"email_verified": True, "email": "grace@acme.test", "name": "Grace"}}
    )
    page = ui.page_for(None, "/accounts/login/")

    page.fill("#id_organization", "acme")
    page.click("text=Continue with single sign-on")
    page.wait_for_url(f"{openid_provider.issuer}/**")
    openid_provider.fill_in_login_and_consent(page, "grace")

    page.wait_for_url(f"{QUOR}/")
    assert "grace@acme.test" in page.content()

    page.click("text=Log out")
    openid_provider.confirm_logout(page)
    page.wait_for_url(f"{QUOR}/accounts/login/**")
    assert urlsplit(page.url).path == "/accounts/login/"
    page.goto(f"{QUOR}/")
    assert urlsplit(page.url).path == "/accounts/login/"


@pytest.mark.parametrize("viewport", ["desktop"])
def test_a_refused_sign_in_shows_a_page_that_says_why(ui, sso, openid_provider, colleague):
    colleague.is_active = False
    colleague.save()
    openid_provider.set_accounts({"colleague": {"email_verified": True, "email": colleague.email}})
    page = ui.page_for(None, "/accounts/sso/?organization=acme")  # a link handed out
    page.click("text=Continue with single sign-on")

    page.wait_for_url(f"{openid_provider.issuer}/**")
    openid_provider.fill_in_login_and_consent(page, "colleague")

    page.wait_for_url(f"{QUOR}/accounts/sso/callback/**")
    assert "Your account is deactivated" in page.content()
    assert_accessible(page)
