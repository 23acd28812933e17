"""The sandbox's search endpoint: the sandbox credential (which only the egress proxy
holds) searches as the sandbox's owner, and is accepted nowhere else in knowledge."""

from knowledge import services
from knowledge.principals import principal
from sandboxes.models import hash_token
from tests import factories

RUNTIME_SEARCH = "/api/v1/runtime/knowledge/search"


def sandbox_client(api_client, user, credential="sandbox-credential-for-tests"):
    factories.make_sandbox(user, runtime_credential_hash=hash_token(credential))
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return api_client


def titles(response):
    assert response.status_code == 200, response.content
    return {result["title"] for result in response.json()["results"]}


def test_a_sandbox_finds_what_its_owner_may_read_and_nothing_more(world, api_client):
    client = sandbox_client(api_client, world.finance_colleague)
    assert titles(client.post(RUNTIME_SEARCH, {"query": "handbook"}, format="json")) == {
        "finance",
        "everyone",
    }
    assert "owner" not in titles(
        client.post(RUNTIME_SEARCH, {"query": "quokkaowner"}, format="json")
    )


def test_a_sandbox_follows_its_owners_access_changes_at_once(world, api_client):
    client = sandbox_client(api_client, world.legal_colleague)
    found = titles(client.post(RUNTIME_SEARCH, {"query": "quokkalegal"}, format="json"))
    assert "legal" in found
    services.document_set_access(world.documents["legal"], [principal("user", world.owner.pk)])
    found = titles(client.post(RUNTIME_SEARCH, {"query": "quokkalegal"}, format="json"))
    assert "legal" not in found


def test_the_sandbox_credential_opens_no_other_knowledge_endpoint(world, api_client):
    client = sandbox_client(api_client, world.admin)
    assert client.post("/api/v1/knowledge/search", {"query": "x"}, format="json").status_code == 401
    assert client.get("/api/v1/knowledge/sources/").status_code == 401
    document = world.documents["everyone"]
    response = client.put(
        f"/api/v1/knowledge/documents/{document.pk}/access", {"access": []}, format="json"
    )
    assert response.status_code == 401


def test_a_personal_token_is_not_a_sandbox_credential(world, client_for):
    response = client_for(world.owner).post(RUNTIME_SEARCH, {"query": "handbook"}, format="json")
    assert response.status_code == 401


def test_a_deactivated_owners_sandbox_finds_nothing(world, api_client):
    client = sandbox_client(api_client, world.owner)
    world.owner.is_active = False
    world.owner.save()
    assert client.post(RUNTIME_SEARCH, {"query": "handbook"}, format="json").status_code == 401
