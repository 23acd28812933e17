"""The permission-aware search: only passages of documents the caller may read.

Two rankings, PostgreSQL full-text search and pgvector's nearest neighbours, are fused
by rank. The caller's principals (knowledge/principals.py) filter inside each of them,
before any ranking or limit, and the final documents are checked again against their current
access lists. No count, facet or score of anything else leaves this module, and a
source filter naming sources the caller cannot see answers exactly as one naming
sources with no match."""

import itertools
import re
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchRank
from django.db import connection, transaction
from django.db.models import Exists, F, Func, OuterRef, Value, Window
from django.db.models.functions import RowNumber
from pgvector.django import CosineDistance

from knowledge import embeddings
from knowledge.chunking import passage_title
from knowledge.extraction import CONTENT_TYPES
from knowledge.models import KnowledgeChunk, KnowledgeDocument, KnowledgeSource
from knowledge.principals import principals_for
from knowledge.services import SEARCH_CONFIG
from quor.lib.errors import InvalidInput

MAX_QUERY_CHARS = 1000
MAX_LIMIT = 50
MAX_SOURCE_FILTERS = 100
CANDIDATES = 50  # documents each ranking offers to the fusion
RANKED_PASSAGES = 500  # passages the words ranking ranks by cover density
RRF_K = 60  # the constant of reciprocal rank fusion (Cormack et al.)
CHUNKS_PER_DOCUMENT = 4  # chunks the vector ranking reads per document it offers
EF_SEARCH = 200  # HNSW candidate list, and the fewest chunks the index scan reads
MAX_SCAN_TUPLES = 50_000  # how far an iterative scan goes for a caller who reads little
# Cosine distance 0.7 (similarity 0.3) with all-MiniLM-L6-v2: paraphrases score about
# 0.5 and more, unrelated sentences under 0.2 (bench/knowledge.py's fixture).
MAX_DISTANCE = 0.7
_TERMS = re.compile(r'-?"[^"]*"?|\S+')  # websearch_to_tsquery's terms: "phrases" and words
_LEXEME = re.compile(r"[\w.\-/]+")  # what to_tsvector makes of words, safe to quote
MAX_QUERY_WORDS = 12  # of a long query, the first (66 pairs)
COMMON_WORD_SHARE = 0.02  # a word in more passages than this ranks but does not select
COMMON_PAIRS_BUDGET = 2500  # when every word is common: passages their pairs may select


@dataclass(frozen=True)
class SearchResult:
    document_id: int
    title: str
    url: str
    passage: str
    source_id: int
    source_name: str
    content_type: str
    updated_at: datetime | None


class LexemeQuery(SearchQuery):
    """A tsquery in tsquery's own syntax, of lexemes already made: cast, not parsed
    again (to_tsquery would split `ledger-sync` into a costly phrase)."""

    template = "%(expressions)s::tsquery"

    def __init__(self, text: str):
        Func.__init__(self, Value(text))
        self.config = None
        self.invert = False


@dataclass(frozen=True)
class QueryWords:
    match: SearchQuery  # what the words ranking matches and ranks
    highlight: SearchQuery  # any of the words: what ranks and cuts a result's passage


def sources_readable_by(user):
    """The sources of the user's organization with a document the user may read (the
    search's filter offers these; an admin manages every source elsewhere)."""
    readable = KnowledgeDocument.objects.filter(
        source=OuterRef("pk"), access__overlap=principals_for(user)
    )
    return KnowledgeSource.objects.filter(
        organization__memberships__user=user, organization__is_active=True
    ).filter(Exists(readable))


def clean_query(query) -> str:
    if not isinstance(query, str):
        raise InvalidInput("The query must be text.", code="knowledge.invalid_query")
    cleaned = " ".join(query.split())
    if not cleaned:
        raise InvalidInput("The query is empty.", code="knowledge.invalid_query")
    if len(cleaned) > MAX_QUERY_CHARS:
        raise InvalidInput(
            f"The query is longer than {MAX_QUERY_CHARS} characters.",
            code="knowledge.invalid_query",
        )
    if any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in cleaned):
        raise InvalidInput("The query contains control characters.", code="knowledge.invalid_query")
    if all(term.startswith("-") or term.lower() == "or" for term in _TERMS.findall(cleaned)):
        raise InvalidInput(
            "The query needs a word to look for, not only words to leave out.",
            code="knowledge.invalid_query",
        )
    return cleaned


def _check_filters(source_ids, content_types, limit):
    if source_ids is not None and (
        len(source_ids) > MAX_SOURCE_FILTERS
        or not all(isinstance(pk, int) and not isinstance(pk, bool) for pk in source_ids)
    ):
        raise InvalidInput(
            f"Sources are at most {MAX_SOURCE_FILTERS} source ids.", code="knowledge.invalid_filter"
        )
    if content_types is not None and not set(content_types) <= set(CONTENT_TYPES):
        raise InvalidInput(
            "Types are among: " + ", ".join(CONTENT_TYPES) + ".", code="knowledge.invalid_filter"
        )
    if not (isinstance(limit, int) and 1 <= limit <= MAX_LIMIT):
        raise InvalidInput(f"The limit is 1 to {MAX_LIMIT}.", code="knowledge.invalid_filter")


def search_for_user(user, query, *, source_ids=None, content_types=None, limit=10):
    """The best passage of each of the `limit` best documents `user` may read: the
    full-text and the vector rankings of documents, fused by rank (RRF)."""
    query = clean_query(query)
    _check_filters(source_ids, content_types, limit)
    embedder = embeddings.get_embedder()
    try:
        query_vector = embedder.embed_query(_kept_words(query))
    except embeddings.NothingToEmbed:
        raise InvalidInput(
            "The query has no words to search for.", code="knowledge.invalid_query"
        ) from None
    principals = principals_for(user)
    if not principals:
        return []
    organization_id = user.membership.organization_id
    words = words_of(query)
    chunks = _without_left_out_words(
        readable_chunks(principals, organization_id, source_ids, content_types), query
    )
    with transaction.atomic():
        by_words = best_chunks_by_words(chunks, words, CANDIDATES)
        # The statistics know the access lists, not what a filter or a -word leaves.
        narrowed = source_ids is not None or content_types is not None or _left_out(query)
        by_meaning = best_chunks_by_meaning(
            chunks,
            query_vector,
            embedder.name,
            CANDIDATES,
            0.0 if narrowed else readable_share(principals),
        )
        best_chunk = dict(fuse_rankings(by_words, by_meaning)[:limit])
        readable = KnowledgeDocument.objects.filter(
            pk__in=best_chunk,
            access__overlap=principals,
            source__organization_id=organization_id,
        ).select_related("source")
        if source_ids is not None:
            readable = readable.filter(source_id__in=source_ids)
        if content_types is not None:  # a document's type changes with its content
            readable = readable.filter(content_type__in=content_types)
        documents = {document.pk: document for document in readable}
        passages = dict(
            KnowledgeChunk.objects.filter(pk__in=best_chunk.values())
            .annotate(
                passage=SearchHeadline(
                    "text",
                    words.highlight,
                    config=SEARCH_CONFIG,
                    start_sel="",
                    stop_sel="",
                    max_words=60,
                    min_words=20,
                )
            )
            .values_list("pk", "passage")
        )
    return [
        SearchResult(
            document_id=document.pk,
            title=document.title,
            url=document.url,
            passage=_without_title(passage, document.title),
            source_id=document.source_id,
            source_name=document.source.name,
            content_type=document.content_type,
            updated_at=document.source_updated_at,
        )
        for document_id, chunk_id in best_chunk.items()
        # A document re-indexed meanwhile has new passages: it is left out this once.
        if (document := documents.get(document_id)) and (passage := passages.get(chunk_id))
    ]


def readable_chunks(principals, organization_id, source_ids=None, content_types=None):
    """The passages a caller with `principals` may read in the organization, filtered.
    A document being indexed again keeps its passages until the new ones replace them."""
    chunks = KnowledgeChunk.objects.filter(
        access__overlap=principals, organization_id=organization_id
    )
    if source_ids is not None:
        chunks = chunks.filter(source_id__in=source_ids)
    if content_types is not None:
        chunks = chunks.filter(content_type__in=content_types)
    return chunks


def best_chunks_by_words(chunks, words: QueryWords, count) -> list[tuple[int, int]]:
    """(document id, its best chunk id) of the `count` documents whose best passage
    matches the words best, best first: ranked by cover density of any of the words
    (the pairs that select the passages would cost ten times as much to rank by).

    Cover density costs about 15 µs a passage: on a large table, where common words
    match tens of thousands, only the RANKED_PASSAGES best by frequency (ts_rank, 3 µs)
    are ranked by it. The passages are found through the full-text index even where the
    planner would read the whole table, which it thinks cheaper only because it prices
    a match at a fraction of its cost."""
    best_first = [F("rank").desc(), F("pk").asc()]
    most_frequent = (
        chunks.filter(search_vector=words.match)
        .annotate(frequency=SearchRank(F("search_vector"), words.highlight))
        .order_by("-frequency", "pk")
        .values("pk")[:RANKED_PASSAGES]
    )
    with _planner_setting("enable_seqscan", "off"):
        return list(
            KnowledgeChunk.objects.filter(pk__in=most_frequent)
            .annotate(rank=SearchRank(F("search_vector"), words.highlight, cover_density=True))
            .annotate(place=Window(RowNumber(), partition_by=F("document_id"), order_by=best_first))
            .filter(place=1)  # one passage per document, before the limit
            .order_by(*best_first)
            .values_list("document_id", "pk")[:count]
        )


@contextmanager
def _planner_setting(name: str, value: str):
    """A planner setting for the statements inside, then back to what it was (a caller's
    own setting included). Local to the transaction: a failed statement rolls it back."""
    if not connection.in_atomic_block:
        raise RuntimeError("a transaction-local planner setting outside a transaction")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s), set_config(%s, %s, true)", [name, name, value])
        previous, _ = cursor.fetchone()
    yield
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config(%s, %s, true)", [name, previous])


def best_chunks_by_meaning(
    chunks, query_vector, model_name, count, readable_share=0.0
) -> list[tuple[int, int]]:
    """(document id, its nearest chunk id) of the `count` documents with the passages
    nearest the query's embedding, nearest first.

    Passages farther than MAX_DISTANCE are not offered: nearest is not always near, and
    a search for something nobody wrote about should find nothing. The HNSW index scan
    goes on past chunks the filters drop (pgvector's iterative scan) until it has read
    CHUNKS_PER_DOCUMENT times count of them, or more for a caller who may read a large
    `readable_share` of all passages (rows_to_read), so a caller who may read few chunks
    still gets their nearest ones; relaxed order is sorted here."""
    wanted = CHUNKS_PER_DOCUMENT * count
    by_distance = chunks.filter(embedding_model=model_name).annotate(
        distance=CosineDistance("embedding", query_vector)
    )
    fields = ("distance", "pk", "document_id")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        cursor.execute(f"SET LOCAL hnsw.ef_search = {EF_SEARCH:d}")
        cursor.execute(f"SET LOCAL hnsw.max_scan_tuples = {MAX_SCAN_TUPLES:d}")
    # In relaxed order the scan's first rows are near, not the nearest: it reads at least
    # a whole candidate list and the nearest of those are kept.
    fetched = max(wanted, rows_to_read(readable_share))
    nearest = list(by_distance.order_by("distance").values_list(*fields)[:fetched])
    if len(nearest) < fetched:
        # The caller reads fewer passages than that, or the index scan gave up after
        # MAX_SCAN_TUPLES: then every readable passage is compared, so what a caller who
        # reads little gets does not depend on how many others lie nearer. The order is
        # one the HNSW index cannot give (distance + 0), so no plan can use it here.
        exact_order = by_distance.annotate(exact_distance=F("distance") + Value(0.0))
        nearest = list(exact_order.order_by("exact_distance").values_list(*fields)[:fetched])
    nearest = sorted(nearest)[:wanted]
    ranking = {}
    for distance, chunk_id, document_id in nearest:
        if distance <= MAX_DISTANCE:
            ranking.setdefault(document_id, chunk_id)
    return list(ranking.items())[:count]


def rows_to_read(readable_share: float) -> int:
    """How many rows the vector ranking reads from the index scan, for a caller who may
    read `readable_share` of all passages. Recall grows with the rows read, not with a
    longer candidate list (docs/performance.md), and the time with the index entries the
    scan passes, about rows / share: a caller who may read most passages, whose scan
    passes few hidden ones, reads up to four times as many rows as one who reads little.
    In three steps only: the share counts every organization's passages, and the time a
    search takes should say little about them."""
    steps = [(0.8, 4 * EF_SEARCH), (0.4, 2 * EF_SEARCH)]
    return next((rows for share, rows in steps if readable_share >= share), EF_SEARCH)


def readable_share(principals: list[str]) -> float:
    """An estimate of the share of all passages whose access lists name one of
    `principals`, at most 1: the sum of their shares in PostgreSQL's statistics of the
    column (none for a principal it did not list)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(share), 0) FROM pg_stats, unnest("
            "  most_common_elems::text::text[], most_common_elem_freqs) AS c(element, share)"
            " WHERE schemaname = current_schema() AND tablename = 'knowledge_knowledgechunk'"
            "   AND attname = 'access'"
            "   AND element = ANY(%s)",
            [principals],
        )
        (share,) = cursor.fetchone()
    return min(1.0, share)


def _kept_words(query: str) -> str:
    """The query's words and phrases without the ones it leaves out, unquoted: what its
    embedding should mean (`-euros` would pull the meaning towards euros)."""
    return " ".join(term.strip('"') for term in _TERMS.findall(query) if not term.startswith("-"))


def words_of(query: str) -> QueryWords:
    """What the words ranking matches (selecting_tsquery) and ranks: PostgreSQL's lexemes
    of the query (stemmed, without stop words), with each lexeme's share of the passages
    from PostgreSQL's own statistics of the column, and every "phrase" it quotes."""
    kept = [term for term in _TERMS.findall(query) if not term.startswith("-")]
    phrases = [term.strip('"') for term in kept if term.startswith('"') and term.strip('"')]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(array_agg(lexeme ORDER BY min_position), '{}'),"
            "       coalesce(array_agg(coalesce(share, 0) ORDER BY min_position), '{}'),"
            "       (SELECT greatest(reltuples, 0) FROM pg_class"
            "        WHERE oid = 'knowledge_knowledgechunk'::regclass) FROM ("
            "  SELECT word.lexeme, min(position) AS min_position, max(common.share) AS share"
            "  FROM unnest(to_tsvector(%s::regconfig, %s)) AS word"
            "  CROSS JOIN LATERAL unnest(word.positions) AS position"
            "  LEFT JOIN ("
            "    SELECT element, share FROM pg_stats, unnest("
            "      most_common_elems::text::text[], most_common_elem_freqs) AS c(element, share)"
            "    WHERE schemaname = current_schema()"
            "      AND tablename = 'knowledge_knowledgechunk' AND attname = 'search_vector'"
            "  ) AS common ON common.element = word.lexeme"
            "  GROUP BY word.lexeme) AS words",
            [SEARCH_CONFIG, " ".join(term.strip('"') for term in kept)],
        )
        lexemes, shares, passages = cursor.fetchone()
    share_of = {
        lexeme: share
        for lexeme, share in zip(lexemes, shares, strict=True)
        if _LEXEME.fullmatch(lexeme)
    }
    words = list(share_of)[:MAX_QUERY_WORDS]
    match = LexemeQuery(selecting_tsquery(words, share_of, passages))
    for phrase in phrases:
        match &= SearchQuery(phrase, search_type="phrase", config=SEARCH_CONFIG)
    # ts_headline looks for covers of its query: with the pairs it can need gigabytes.
    highlight = LexemeQuery(" | ".join(f"'{word}'" for word in words))
    return QueryWords(match, highlight)


def selecting_tsquery(words: list[str], share_of: dict[str, float], passages: float) -> str:
    """The tsquery of the passages the words ranking ranks: those with at least two of
    the query's words that are not common (any one, if only one or two are not).

    All of the words (websearch's AND) drops every passage that misses one word of a
    question typed in full; any one of them matches most of a large table on a common
    word, and ranking costs by the passage. So common words (in more than
    COMMON_WORD_SHARE of the passages) rank but do not select. When every word is
    common, pairs of the least common select, as many words as keep the passages
    expected to hold a pair (independent words) within COMMON_PAIRS_BUDGET."""
    quoted = {word: f"'{word}'" for word in words}
    selecting = [word for word in words if share_of[word] <= COMMON_WORD_SHARE]
    if 0 < len(selecting) <= 2:
        return " | ".join(quoted[word] for word in selecting)
    if not selecting:
        by_share = sorted(words, key=share_of.__getitem__)
        selecting = by_share[:2]
        for word in by_share[2:]:
            if _passages_with_a_pair([*selecting, word], share_of, passages) > COMMON_PAIRS_BUDGET:
                break
            selecting.append(word)
        selecting.sort(key=words.index)
    if len(selecting) == 1:
        return quoted[selecting[0]]
    return " | ".join(
        f"({quoted[a]} & {quoted[b]})" for a, b in itertools.combinations(selecting, 2)
    )


def _passages_with_a_pair(words, share_of, passages) -> float:
    """Expected passages holding a pair of `words`, as if independent: the sum over the
    pairs, so a passage with three of them counts thrice (an upper bound of the sum)."""
    return passages * sum(share_of[a] * share_of[b] for a, b in itertools.combinations(words, 2))


def _left_out(query: str) -> list[str]:
    """The words and phrases the query leaves out (`-word`, `-"a phrase"`)."""
    return [term[1:] for term in _TERMS.findall(query) if term.startswith("-") and term != "-"]


def _without_left_out_words(chunks, query: str):
    """The chunks without the words the query leaves out, for both rankings (an
    embedding knows no negation)."""
    left_out = _left_out(query)
    if not left_out:
        return chunks
    return chunks.exclude(
        search_vector=SearchQuery(
            " or ".join(left_out), search_type="websearch", config=SEARCH_CONFIG
        )
    )


def fuse_rankings(*rankings) -> list[tuple[int, int]]:
    """Reciprocal rank fusion of document rankings: each document scores the sum of
    1 / (RRF_K + its rank) over the rankings it is in. Its passage is the one of the
    first ranking that has it (the words' passage reads best as a snippet)."""
    scores, chunk_of = {}, {}
    for ranking in rankings:
        for rank, (document_id, chunk_id) in enumerate(ranking, start=1):
            scores[document_id] = scores.get(document_id, 0.0) + 1.0 / (RRF_K + rank)
            chunk_of.setdefault(document_id, chunk_id)
    ordered = sorted(scores, key=lambda document_id: (-scores[document_id], document_id))
    return [(document_id, chunk_of[document_id]) for document_id in ordered]


def _without_title(passage: str, title: str) -> str:
    """Passages start with their document's title (chunking.py); results show it apart."""
    prefix = passage_title(title)
    return passage[len(prefix) :].lstrip() if passage.startswith(prefix) else passage
