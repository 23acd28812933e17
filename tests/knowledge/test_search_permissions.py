"""The leak matrix: every persona, every kind of access list, a query that matches each
document exactly. A response names only documents the caller may read: in results,
passages and the number of results; anything else answers exactly like no match."""

import json

import pytest

from knowledge import services
from knowledge.principals import principal
from knowledge.search import search_for_user
from quor.models import Membership

SEARCH = "/api/v1/knowledge/search"
KEYS = ["nobody", "owner", "finance", "legal", "everyone", "deactivated", "globex"]
VISIBLE = {
    "owner": {"owner", "finance", "everyone"},
    "finance_colleague": {"finance", "everyone"},
    "legal_colleague": {"legal", "everyone"},
    "admin": {"everyone"},  # managing documents is not reading them
    "stranger": {"globex"},
}


def search(client, query, **filters):
    response = client.post(SEARCH, {"query": query, **filters}, format="json")
    assert response.status_code == 200, response.content
    return response


def keys_in(response) -> set[str]:
    return {result["title"] for result in response.json()["results"]}


def first_key(response) -> str | None:
    results = response.json()["results"]
    return results[0]["title"] if results else None


@pytest.mark.parametrize("persona", sorted(VISIBLE))
def test_a_persona_finds_exactly_the_documents_it_may_read(world, client_for, persona):
    client = client_for(getattr(world, persona))
    hidden = set(KEYS) - VISIBLE[persona]
    everything = search(client, "handbook chapter", limit=50)
    assert keys_in(everything) == VISIBLE[persona]
    assert not any(f"quokka{key}" in everything.content.decode() for key in hidden)
    for key in KEYS:
        response = search(client, f"quokka{key}")
        assert keys_in(response) <= VISIBLE[persona]
        if key in VISIBLE[persona]:
            result = response.json()["results"][0]
            assert result["title"] == key
            assert f"quokka{key}" in result["passage"]
        else:
            assert key not in keys_in(response)
        assert not any(f"quokka{other}" in response.content.decode() for other in hidden)


@pytest.mark.parametrize("key", ["owner", "legal", "nobody", "globex"])
def test_a_hidden_document_changes_no_byte_of_any_answer(world, client_for, key):
    """The answer is the same with the hidden document as without it, for a query that
    matches it exactly and for one that matches everything."""
    client = client_for(world.finance_colleague)
    queries = [f"quokka{key}", "handbook chapter", f"quokka{key} handbook"]
    with_it = [search(client, query, limit=50) for query in queries]
    services.document_delete(world.documents[key])
    without_it = [search(client, query, limit=50) for query in queries]
    assert [r.content for r in with_it] == [r.content for r in without_it]
    assert [dict(r.headers).keys() for r in with_it] == [dict(r.headers).keys() for r in without_it]


def test_a_deactivated_user_matches_nothing_even_on_their_own_documents(world, client_for):
    client = client_for(world.deactivated)
    assert client.post(SEARCH, {"query": "quokkadeactivated"}, format="json").status_code == 401
    assert search_for_user(world.deactivated, "quokkadeactivated") == []


def test_revoking_access_hides_the_document_from_the_very_next_search(world, client_for):
    client = client_for(world.owner)
    assert first_key(search(client, "quokkaowner")) == "owner"
    services.document_set_access(world.documents["owner"], [])
    assert "owner" not in keys_in(search(client, "quokkaowner"))


def test_leaving_a_group_hides_its_documents_from_the_very_next_search(world, client_for):
    client = client_for(world.finance_colleague)
    assert first_key(search(client, "quokkafinance")) == "finance"
    world.finance_colleague.groups.remove(world.finance)
    assert "finance" not in keys_in(search(client, "quokkafinance"))


def test_deactivating_a_member_hides_everything_from_the_very_next_search(world):
    assert {r.title for r in search_for_user(world.owner, "handbook")} == VISIBLE["owner"]
    world.owner.is_active = False
    world.owner.save()
    assert search_for_user(world.owner, "handbook") == []


def test_leaving_the_organization_hides_its_documents(world):
    Membership.objects.filter(user=world.legal_colleague).delete()
    world.legal_colleague.refresh_from_db()
    assert search_for_user(world.legal_colleague, "handbook") == []


def test_a_disabled_organizations_members_find_nothing(world):
    world.acme.is_active = False
    world.acme.save()
    assert search_for_user(world.owner, "handbook") == []


def test_granting_access_shows_the_document_at_once(world, client_for):
    client = client_for(world.legal_colleague)
    assert "nobody" not in keys_in(search(client, "quokkanobody"))
    services.document_set_access(
        world.documents["nobody"], [principal("user", world.legal_colleague.pk)]
    )
    assert first_key(search(client, "quokkanobody")) == "nobody"


def test_a_filter_naming_another_organizations_source_answers_like_an_empty_source(
    world, client_for
):
    client = client_for(world.owner)
    empty = services.source_create(organization=world.acme, name="Empty")
    foreign = search(client, "handbook", sources=[world.globex_wiki.pk])
    unknown = search(client, "handbook", sources=[999999])
    nothing_here = search(client, "handbook", sources=[empty.pk])
    assert foreign.content == unknown.content == nothing_here.content == b'{"results":[]}'
    assert keys_in(search(client, "handbook", sources=[world.handbook.pk])) == VISIBLE["owner"]


def test_a_content_update_keeps_the_documents_access_list(world, client_for):
    document = world.documents["owner"]
    updated = services.document_put_content(
        source=world.handbook, name="owner.md", data=b"Handbook chapter, new. quokkarenewed."
    )
    services.document_index(updated.pk)
    updated.refresh_from_db()
    assert updated.access == [principal("user", world.owner.pk)]
    assert first_key(search(client_for(world.owner), "quokkarenewed")) == "owner"
    assert "owner" not in keys_in(search(client_for(world.finance_colleague), "quokkarenewed"))
    assert document.pk == updated.pk


def test_a_sources_listing_shows_members_only_sources_they_can_read_from(world, client_for):
    names = {
        s["name"]
        for s in client_for(world.owner).get("/api/v1/knowledge/sources/").json()["results"]
    }
    assert names == {"Handbook"}
    services.source_create(organization=world.acme, name="Secret plans")
    admin_names = {
        s["name"]
        for s in client_for(world.admin).get("/api/v1/knowledge/sources/").json()["results"]
    }
    assert admin_names == {"Handbook", "Secret plans"}
    stranger = client_for(world.stranger).get("/api/v1/knowledge/sources/").json()["results"]
    assert [s["name"] for s in stranger] == ["Globex wiki"]


def test_results_carry_title_link_passage_source_and_time(world, client_for):
    result = search(client_for(world.owner), "quokkaeveryone").json()["results"][0]
    assert result["title"] == "everyone"
    assert result["url"] == "everyone.md"
    assert result["source"] == world.handbook.pk and result["source_name"] == "Handbook"
    assert result["type"] == "markdown"
    assert result["updated_at"]
    assert json.dumps(result).count("quokkaeveryone") == 1


def test_a_chunk_whose_access_copy_is_stale_is_caught_by_the_final_check(world, client_for):
    from knowledge.models import KnowledgeChunk

    KnowledgeChunk.objects.filter(document=world.documents["owner"]).update(
        access=[principal("user", world.finance_colleague.pk)]
    )
    assert "owner" not in keys_in(search(client_for(world.finance_colleague), "quokkaowner"))


def test_hidden_documents_that_rank_higher_never_crowd_out_a_readable_one(world, client_for):
    from tests.knowledge.conftest import add_document

    for number in range(5):
        add_document(
            world.handbook, f"secret-{number}.md",
            "Budget budget budget: the budget of the secret budget plan. " * 20, [],
        )  # fmt: skip
    add_document(
        world.handbook, "public.md", "Notes that mention the budget once.",
        [principal("org", world.acme.pk)],
    )  # fmt: skip
    results = search(client_for(world.legal_colleague), "budget", limit=1).json()["results"]
    assert [r["title"] for r in results] == ["public"]


def test_one_document_with_many_matching_passages_leaves_room_for_the_others(world, client_for):
    from tests.knowledge.conftest import add_document

    long_text = "\n\n".join(f"Handbook section {i} on handbook matters." for i in range(300))
    add_document(world.handbook, "long.md", long_text, [principal("org", world.acme.pk)])
    found = keys_in(search(client_for(world.owner), "handbook", limit=10))
    assert found == VISIBLE["owner"] | {"long"}


def test_another_organizations_member_in_our_group_still_reads_nothing_of_ours(world):
    world.stranger.groups.add(world.finance)
    assert {r.title for r in search_for_user(world.stranger, "handbook")} == {"globex"}


@pytest.mark.parametrize(
    "written", ["user:007", "user:\u00b2", "user:\u0661\u0662", "user: 1", "User:1"]
)
def test_a_principal_written_any_other_way_is_refused(world, written):
    with pytest.raises(Exception) as refused:
        services.document_set_access(world.documents["nobody"], [written])
    assert getattr(refused.value, "code", "") == "knowledge.invalid_access"


def test_a_query_of_only_words_to_leave_out_is_refused(world, client_for):
    response = client_for(world.owner).post(SEARCH, {"query": "-secret -budget"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "knowledge.invalid_query"
