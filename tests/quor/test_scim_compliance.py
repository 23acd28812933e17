"""An independent SCIM 2.0 compliance checker (scim2-tester, from PyPI) runs every check
it has against Quor's /scim/v2/ over HTTP, as an identity provider's connector would.

scim2's packages are imported where they are used, not with the module: their models read
the source of their docstrings as they are defined (pydantic's attribute docstrings), about
5 s of every test process's collection otherwise."""

import uuid

import httpx2
import pytest

from quor import service_accounts
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scim_token(org):
    factories.make_verified_domain(org, "example.test")  # the userNames below
    account = service_accounts.service_account_create(
        organization=org, name="Identity provider", scopes=["scim"]
    )
    _, raw_token = service_accounts.service_account_token_create(account=account)
    return raw_token


@pytest.fixture
def user_names_are_email_addresses(monkeypatch):
    """The checker makes up a UUID for an attribute it knows no example of; Quor's
    userName is an email address (quor/scim.py), so the checker is given fresh ones."""
    import scim2_tester.filling

    made_up = scim2_tester.filling.get_random_example_value

    def example(path):
        if str(path).rpartition(":")[2] == "userName":
            return f"{uuid.uuid4()}@example.test"
        return made_up(path)

    monkeypatch.setattr(scim2_tester.filling, "get_random_example_value", example)


def test_the_scim_compliance_checker_finds_nothing_wrong(
    quor_web, scim_token, user_names_are_email_addresses
):
    from scim2_client.engines.httpx2 import SyncSCIMClient
    from scim2_tester import Status, check_server

    # The first SCIM request imports SCIM's payload models in the web process (about a
    # second of CPU); with the cores shared by the whole run that can take longer than
    # httpx's 5 s default, which the checker reports as a network error.
    http = httpx2.Client(
        base_url=f"{quor_web}/scim/v2",
        headers={"Authorization": f"Bearer {scim_token}"},
        timeout=30,
    )
    results = check_server(SyncSCIMClient(http))
    problems = [
        (result.title, result.status.name, result.reason)
        for result in results
        if result.status not in (Status.SUCCESS, Status.COMPLIANT, Status.ACCEPTABLE)
    ]
    for problem in problems:
        print("PROBLEM", problem[0], problem[1], str(problem[2])[:300])
    assert problems == []
    assert len(results) > 20
