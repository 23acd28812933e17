"""The two rankings and their fusion: words (PostgreSQL full-text search) and meaning
(pgvector's HNSW index over the passages' embeddings), each filtered by access inside
its own scan."""

import numpy
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from knowledge import search, services
from knowledge.embeddings import get_embedder
from knowledge.models import KnowledgeChunk
from knowledge.principals import principal
from knowledge.search import (
    CHUNKS_PER_DOCUMENT,
    best_chunks_by_meaning,
    best_chunks_by_words,
    fuse_rankings,
    search_for_user,
)
from tests.knowledge.conftest import add_document

EXPENSES = "Travel expenses are reimbursed within thirty days of submitting the receipts."
EXPENSES_QUESTION = "how fast do I get my money back for a trip"


def titles(results) -> list[str]:
    return [result.title for result in results]


def test_a_document_sharing_no_word_with_the_query_is_found_by_its_meaning(world):
    add_document(world.handbook, "expenses.md", EXPENSES, [principal("org", world.acme.pk)])
    assert titles(search_for_user(world.legal_colleague, EXPENSES_QUESTION))[0] == "expenses"
    words = search.words_of(EXPENSES_QUESTION)
    assert best_chunks_by_words(KnowledgeChunk.objects.all(), words, 10) == []


def test_a_query_about_nothing_anyone_wrote_finds_nothing(world):
    add_document(world.handbook, "expenses.md", EXPENSES, [principal("org", world.acme.pk)])
    assert search_for_user(world.owner, "xylophone concert tickets") == []


def test_a_document_found_by_both_rankings_comes_before_one_found_by_either():
    by_words = [(1, 11), (2, 21)]
    by_meaning = [(3, 31), (2, 22)]
    assert fuse_rankings(by_words, by_meaning) == [(2, 21), (1, 11), (3, 31)]
    assert fuse_rankings([], by_meaning) == by_meaning
    assert fuse_rankings([(5, 51)], [(4, 41)]) == [(4, 41), (5, 51)]  # a tie: the older first


def add_passages(document, vectors, access):
    """Passages of `document` with the given embeddings (the text is the first one's)."""
    template = KnowledgeChunk.objects.filter(document=document).first()
    start = KnowledgeChunk.objects.filter(document=document).count()
    KnowledgeChunk.objects.bulk_create(
        KnowledgeChunk(
            document=document,
            organization_id=template.organization_id,
            source_id=template.source_id,
            content_type=template.content_type,
            position=start + offset,
            text=template.text,
            embedding=vector,
            embedding_model=template.embedding_model,
            access=access,
        )
        for offset, vector in enumerate(vectors)
    )


@pytest.fixture
def crowded(world):
    """A readable passage behind far more hidden ones nearer the query than the index
    scan's first batch, and more readable passages than the vector ranking reads (far
    from the query), so the index scan alone could answer."""
    everyone = [principal("org", world.acme.pk)]
    add_document(
        world.handbook,
        "reimbursement.md",
        "Money spent on business trips is paid back to staff.",
        everyone,
    )
    noise = numpy.random.default_rng(seed=18)
    vector = get_embedder().embed_passages([EXPENSES])[0]

    def unit(vectors):
        return vectors / numpy.linalg.norm(vectors, axis=1, keepdims=True)

    filler = add_document(world.handbook, "filler.md", "Unrelated filler.", everyone)
    add_passages(filler, unit(noise.normal(0, 1, (CHUNKS_PER_DOCUMENT * 60, 384))), everyone)
    hidden = add_document(world.handbook, "hidden.md", EXPENSES, [])
    # Near the query but not one point: a crowd of one point is no graph a scan can walk.
    near = vector + noise.normal(0, 0.03, (3 * CHUNKS_PER_DOCUMENT * 50, 384))
    add_passages(hidden, unit(near.astype(numpy.float32)), [])
    with connection.cursor() as cursor:
        # A graph of this test's passages, without the dead ones earlier tests left behind
        # (autovacuum's work on a real server), which change who is reachable from where.
        cursor.execute("REINDEX INDEX knowledge_chunk_nearest")


def search_through_the_index(user, query):
    """search_for_user with the planner made to use the HNSW index, as on a large table
    (here reading the organization's passages and sorting them would be cheaper); the
    results and the plans of the vector ranking's statements."""
    with transaction.atomic(), connection.cursor() as cursor:
        for kind in ("seqscan", "bitmapscan", "sort"):
            cursor.execute(f"SET LOCAL enable_{kind} = off")
        with CaptureQueriesContext(connection) as queries:
            results = search_for_user(user, query, limit=1)
        nearest = [q["sql"] for q in queries.captured_queries if "<=>" in q["sql"]]
        plans = []
        for statement in nearest:
            cursor.execute("EXPLAIN " + statement)
            plans.append("\n".join(line for (line,) in cursor.fetchall()))
    assert "Index Scan using knowledge_chunk_nearest" in plans[0]
    return results, plans


def test_the_index_scan_goes_on_past_hidden_passages_to_the_readable_ones(world, crowded):
    results, plans = search_through_the_index(world.legal_colleague, EXPENSES)
    assert titles(results) == ["reimbursement"]
    assert len(plans) == 1  # the index scan found enough by itself: no exact search


def test_when_the_index_scan_gives_up_every_readable_passage_is_compared(
    world, crowded, monkeypatch
):
    monkeypatch.setattr(search, "MAX_SCAN_TUPLES", 100)
    results, plans = search_through_the_index(world.legal_colleague, EXPENSES)
    assert titles(results) == ["reimbursement"]
    assert len(plans) == 2  # the index scan, then the exact search, which no plan
    assert "knowledge_chunk_nearest" not in plans[1]  # can give to the index


def test_passages_embedded_by_another_model_are_not_compared_and_reindexing_embeds_them_again(
    world,
):
    document = add_document(
        world.handbook, "expenses.md", EXPENSES, [principal("org", world.acme.pk)]
    )
    embedder = get_embedder()
    chunks = KnowledgeChunk.objects.filter(document=document)
    assert set(chunks.values_list("embedding_model", flat=True)) == {embedder.name}
    chunks.update(embedding_model="an-older-model")
    query = embedder.embed_query(EXPENSES_QUESTION)
    assert best_chunks_by_meaning(KnowledgeChunk.objects.all(), query, embedder.name, 10) == []
    services.document_index(document.pk)
    assert set(chunks.values_list("embedding_model", flat=True)) == {embedder.name}
    assert [doc for doc, _ in best_chunks_by_meaning(chunks, query, embedder.name, 10)] == [
        document.pk
    ]


def test_a_left_out_word_is_left_out_of_the_meaning_ranking_too(world):
    add_document(world.handbook, "expenses.md", EXPENSES, [principal("org", world.acme.pk)])
    add_document(
        world.handbook,
        "trips.md",
        "Receipts for trips abroad are reimbursed in euros.",
        [principal("org", world.acme.pk)],
    )
    found = titles(search_for_user(world.owner, EXPENSES_QUESTION + " -euros"))
    assert "expenses" in found and "trips" not in found


def test_the_query_is_embedded_without_the_words_it_leaves_out():
    assert search._kept_words('trips abroad -euros -"per diem" "train tickets"') == (
        "trips abroad train tickets"
    )


@pytest.mark.parametrize("setting", ["on", "off"])
def test_the_words_ranking_leaves_the_planner_settings_as_it_found_them(world, setting):
    add_document(world.handbook, "expenses.md", EXPENSES, [principal("org", world.acme.pk)])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL enable_seqscan = {setting}")
        found = best_chunks_by_words(KnowledgeChunk.objects.all(), search.words_of(EXPENSES), 10)
        cursor.execute("SHOW enable_seqscan")
        assert cursor.fetchone() == (setting,)
    assert len(found) == 1


def test_only_readable_passages_compete_for_the_passages_ranked_by_cover_density(
    world, monkeypatch
):
    monkeypatch.setattr(search, "RANKED_PASSAGES", 2)
    everyone = [principal("org", world.acme.pk)]
    for number in range(4):  # more often the words, and nobody may read them
        add_document(world.handbook, f"hidden-{number}.md", f"{EXPENSES} {EXPENSES}", [])
    add_document(world.handbook, "expenses.md", EXPENSES, everyone)
    add_document(world.handbook, "receipts.md", "Keep the receipts of travel.", everyone)
    chunks = search.readable_chunks(search.principals_for(world.legal_colleague), world.acme.pk)
    with transaction.atomic():
        found = best_chunks_by_words(chunks, search.words_of(EXPENSES), 10)
    documents = KnowledgeChunk.objects.filter(pk__in=[chunk for _, chunk in found])
    assert sorted(documents.values_list("document__title", flat=True)) == ["expenses", "receipts"]


def analyze_passages():
    """PostgreSQL's statistics of the passages as they are in this test's transaction
    (they roll back with it; the row estimate in pg_class does not, a planner input)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE knowledge_knowledgechunk")


def test_of_common_words_only_pairs_of_the_least_common_select_within_the_budget(monkeypatch):
    monkeypatch.setattr(search, "COMMON_PAIRS_BUDGET", 5000)
    words = ["need", "payment", "code", "review"]
    share_of = {"need": 0.27, "payment": 0.079, "code": 0.13, "review": 0.166}
    # payment & code: 1 027 passages expected; with review 4 496; with need 14 621.
    assert search.selecting_tsquery(words, share_of, 100_000) == (
        "('payment' & 'code') | ('payment' & 'review') | ('code' & 'review')"
    )
    assert search.selecting_tsquery(words, share_of, 1_000).count("&") == 6
    assert search.selecting_tsquery(["need", "code"], share_of, 10**9) == "('need' & 'code')"
    assert search.selecting_tsquery(["need"], share_of, 10**9) == "'need'"


def test_words_that_are_not_common_select_and_common_ones_only_rank():
    share_of = {"ledger": 0.001, "invoice": 0.002, "audit": 0.003, "the": 0.5}
    assert search.selecting_tsquery(["ledger", "the"], share_of, 10**6) == "'ledger'"
    assert search.selecting_tsquery(["ledger", "the", "audit"], share_of, 10**6) == (
        "'ledger' | 'audit'"
    )
    assert search.selecting_tsquery(["ledger", "invoice", "audit", "the"], share_of, 10**6) == (
        "('ledger' & 'invoice') | ('ledger' & 'audit') | ('invoice' & 'audit')"
    )


def test_the_words_shares_come_from_the_statistics_of_the_passages(world, monkeypatch):
    everyone = [principal("org", world.acme.pk)]
    texts = ["ledger invoice", "invoice audit", "ledger", "ledger", "ledger", "audit"]
    for number, text in enumerate(texts):
        add_document(world.handbook, f"note-{number}.md", f"{text}.", everyone)
    found = {}
    for budget in (5000, 1):  # three pairs of the words; only the two least common
        monkeypatch.setattr(search, "COMMON_PAIRS_BUDGET", budget)
        with transaction.atomic():
            analyze_passages()
            ranked = best_chunks_by_words(
                KnowledgeChunk.objects.all(), search.words_of("ledger invoice audit"), 10
            )
        documents = KnowledgeChunk.objects.filter(pk__in=[chunk for _, chunk in ranked])
        found[budget] = sorted(documents.values_list("document__title", flat=True))
    assert found == {5000: ["note 0", "note 1"], 1: ["note 1"]}


def test_a_callers_share_of_the_passages_comes_from_the_statistics_of_their_access_lists(world):
    legal, everyone = principal("group", world.legal.pk), principal("org", world.acme.pk)
    for number in range(10):
        add_document(world.handbook, f"note-{number}.md", f"Note {number}.", [everyone])
    callers = {"legal": [legal], "everyone": [legal, everyone]}
    with transaction.atomic():
        analyze_passages()
        shares = {
            caller: search.readable_share(principals) for caller, principals in callers.items()
        }
    passages = KnowledgeChunk.objects.count()
    assert shares == {  # no passage here names two of a caller's principals
        caller: pytest.approx(
            KnowledgeChunk.objects.filter(access__overlap=principals).count() / passages
        )
        for caller, principals in callers.items()
    }
    assert shares["legal"] < 0.25 < shares["everyone"]
    assert search.readable_share(["user:0"]) == 0.0


def test_the_rows_read_grow_in_three_steps_with_the_share():
    assert [search.rows_to_read(share) for share in (0.0, 0.39, 0.4, 0.79, 0.8, 1.0)] == [
        search.EF_SEARCH,
        search.EF_SEARCH,
        2 * search.EF_SEARCH,
        2 * search.EF_SEARCH,
        4 * search.EF_SEARCH,
        4 * search.EF_SEARCH,
    ]


def test_a_caller_who_may_read_most_passages_reads_more_rows_unless_a_filter_narrows_them(
    world,
):
    everyone = [principal("org", world.acme.pk)]
    for number in range(30):
        add_document(world.handbook, f"note-{number}.md", f"Note {number}.", everyone)

    def rows_read(**filters):
        with CaptureQueriesContext(connection) as queries:
            search_for_user(world.legal_colleague, "note", **filters)
        index_scan = next(q["sql"] for q in queries.captured_queries if "<=>" in q["sql"])
        return int(index_scan.rsplit("LIMIT", 1)[1])  # then an exact search: few passages

    with transaction.atomic():
        analyze_passages()
        share = search.readable_share(search.principals_for(world.legal_colleague))
        assert share >= 0.4
        assert rows_read() == search.rows_to_read(share) > search.EF_SEARCH
        assert rows_read(source_ids=[world.handbook.pk]) == search.EF_SEARCH
        assert rows_read(content_types=["markdown"]) == search.EF_SEARCH
