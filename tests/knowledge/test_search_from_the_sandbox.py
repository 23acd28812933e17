"""Searching from inside a real sandbox, as the sandbox user, through the real egress
proxy to Quor's real web process: the sandbox finds what its owner may read, follows
its owner's access changes at once, and has no way to search as anyone else."""

import json

import pytest

from knowledge import services as knowledge
from knowledge.principals import principal
from sandboxes.runtime import services

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

RAW_REQUEST = r"""
import json, os, sys, urllib.request
urllib.request.proxy_bypass = lambda host: False
headers = {"Content-Type": "application/json"}
if sys.argv[1]:
    headers["Authorization"] = os.path.expandvars(sys.argv[1])
request = urllib.request.Request(os.environ["QUOR_API_URL"] + sys.argv[2], data=b'{"query": "handbook"}', headers=headers, method="POST")
try:
    with urllib.request.urlopen(request, timeout=20) as response:
        print(response.status, response.read().decode())
except urllib.error.HTTPError as error:
    print(error.code, error.read().decode())
"""


def quor_search(user, *args):
    result = services.sandbox_exec(user=user, argv=["quor-search", *args], timeout_s=60)
    return result.exit_code, result.stdout.decode(), result.stderr.decode()


def titles_found(user, query) -> set[str]:
    code, out, err = quor_search(user, "--json", "--limit", "50", query)
    assert code == 0, err
    return {result["title"] for result in json.loads(out)["results"]}


@pytest.fixture
def sandboxes(world, egress_proxy, clean_runtimes):
    for user in (world.owner, world.legal_colleague):
        services.sandbox_ensure(user=user)


def test_quor_search_in_a_sandbox_finds_exactly_what_its_owner_may_read(world, sandboxes):
    assert titles_found(world.owner, "handbook chapter") == {"owner", "finance", "everyone"}
    assert titles_found(world.legal_colleague, "handbook chapter") == {"legal", "everyone"}
    for hidden in ("nobody", "deactivated", "globex", "finance"):
        found = titles_found(world.legal_colleague, f"quokka{hidden}")
        assert found <= {"legal", "everyone"}
        code, out, _ = quor_search(world.legal_colleague, f"quokka{hidden}")
        assert code == 0 and f"quokka{hidden}" not in out
    code, out, _ = quor_search(world.legal_colleague, "xylophone concert tickets")
    assert (code, out.strip()) == (0, "No document you may read matches.")
    code, out, _ = quor_search(world.owner, "quokkafinance")
    assert code == 0 and "finance" in out and "quokkafinance" in out and "Handbook" in out


def test_the_sandbox_follows_its_owners_access_changes_at_once(world, sandboxes):
    assert "owner" in titles_found(world.owner, "quokkaowner")
    knowledge.document_set_access(world.documents["owner"], [])
    assert "owner" not in titles_found(world.owner, "quokkaowner")
    world.owner.groups.remove(world.finance)
    assert "finance" not in titles_found(world.owner, "quokkafinance")
    knowledge.document_set_access(world.documents["legal"], [principal("user", world.owner.pk)])
    assert "legal" in titles_found(world.owner, "quokkalegal")
    assert "legal" not in titles_found(world.legal_colleague, "quokkalegal")


def test_a_sandbox_cannot_search_without_its_credential_or_with_a_forged_one(world, sandboxes):
    for authorization in ("", "Bearer forged-credential-0123456789"):
        result = services.sandbox_exec(
            user=world.legal_colleague,
            argv=["python3", "-c", RAW_REQUEST, authorization, "/api/v1/runtime/knowledge/search"],
        )
        status, _, body = result.stdout.decode().partition(" ")
        assert status == "401", result.stdout
        assert "quokka" not in body


def test_the_sandbox_credential_opens_no_other_search(world, sandboxes):
    """The proxy injects the sandbox's credential; the user-facing search refuses it."""
    result = services.sandbox_exec(
        user=world.owner,
        argv=["python3", "-c", RAW_REQUEST, "Bearer $QUOR_API_TOKEN", "/api/v1/knowledge/search"],
    )
    status, _, body = result.stdout.decode().partition(" ")
    assert status == "401", result.stdout
    assert "quokka" not in body


def test_a_deactivated_owners_sandbox_finds_nothing(world, sandboxes):
    world.owner.is_active = False
    world.owner.save()
    code, out, err = quor_search(world.owner, "handbook")
    assert code == 1 and out == ""
    assert "Quor refused the search" in err
