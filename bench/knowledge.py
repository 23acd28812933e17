#!/usr/bin/env python3
"""Company knowledge search: quality, filtered vector recall, latency, ingestion, size.

    .venv/bin/python bench/knowledge.py [--sizes 10000,100000] [--rounds 2]
        [--skip-quality] [--skip-scale] [--text copies|manuals] [--keep-passages]

1. Quality and ingestion. The judged fixture (bench/knowledge_fixture: documents,
   queries, graded judgements) is indexed as Quor indexes uploads (knowledge.services:
   extraction in a child process, chunking, embedding, one transaction per document),
   timed: documents/s, passages/s, and the embedding's share. Then every query is
   answered three ways for a member who may read everything: full-text only and vector
   only (the two rankings knowledge.search fuses, each alone) and hybrid (the product's
   answer, knowledge.search.search_for_user). Printed per way, per query kind and
   overall: nDCG@10 (graded gains 2 and 1), recall@10 (documents of grade 1 or 2) and
   MRR (first document of grade 2).
2. Scale. Synthetic passages in another organization, up to each size: each has a
   fixture passage's text and full-text vector, and as its embedding a mix of that
   passage's (50 to 100 %) and another's, moved by Gaussian noise: spread over the space
   real passages occupy, not in tight clusters (embedding 100 000 real passages takes
   hours on 2 cores: about 8 passages/s). Each passage is readable by a group per
   selectivity, drawn independently: 50 %, 10 %, 1 % and 0.1 % of passages, and by the
   organization (100 %). For a reader of each group:
     - recall@10 of the vector ranking as search runs it (the planner's choice of plan,
       and the exact fallback when the index scan returns too few) and with the HNSW
       index forced, against exact search (no index: every readable passage compared),
       over the fixture's queries: strict, and in brackets counting a passage no farther
       than exact search's tenth plus 0.001 as found (ann-benchmarks' measure: ties are no misses);
     - latency p50/p95 of search_for_user end to end (query embedding included);
   and the HNSW build time and the sizes of the table and its indexes; then the query
   embedding alone.
   With `--text manuals --embeddings real` every passage is a manual page's with its own
   embedding (cached by `--embed-manuals`), and the queries are words of manual passages.
3. Timing: a query matching only passages the reader may not read against one matching
   nothing, interleaved (whether the time of an answer tells that hidden matches exist).

Own environment, so it never meets the test suite: database quor_bench_knowledge
(created and migrated if missing, left in place), Redis db 9 (nothing is sent: indexing
runs inline here), file store /tmp/quor-bench-knowledge.
"""

import argparse
import gzip
import hashlib
import io
import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import ensure_database  # noqa: E402

WORK = Path("/tmp/quor-bench-knowledge")  # noqa: S108  (the bench's own scratch directory)
DATABASE = "quor_bench_knowledge"
FIXTURE = ROOT / "bench" / "knowledge_fixture"
SELECTIVITIES = {"all": 1.0, "half": 0.5, "tenth": 0.1, "hundredth": 0.01, "thousandth": 0.001}
CHUNKS_PER_DOCUMENT = 100
TIE_TOLERANCE = 1e-3  # of cosine distance: ann-benchmarks' epsilon for recall
NOISE = 0.02  # per dimension, on top of the mix

os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "quor.settings",
        "QUOR_DEBUG": "1",
        "QUOR_DEPLOYMENT": "benchknowledge",
        "DATABASE_URL": f"postgresql:///{DATABASE}",
        "REDIS_URL": "redis://127.0.0.1:6379/9",
        "QUOR_FILE_STORE_DIR": str(WORK / "files"),
        "QUOR_EGRESS_CA_DIR": str(WORK / "egress-ca"),
    }
)


def setup():
    import django

    ensure_database(DATABASE)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from knowledge import services

    services.send_on_commit = lambda *args: None  # indexing runs inline here


def reader(org_slug: str, email: str, group_name: str | None = None):
    from django.contrib.auth.models import Group

    from quor import services as quor_services
    from quor.models import Organization, User

    organization = Organization.objects.filter(slug=org_slug).first()
    organization = organization or quor_services.organization_create(
        slug=org_slug, name=org_slug.replace("-", " ").capitalize()
    )
    user = User.objects.filter(email=email).first() or quor_services.member_create(
        email=email, organization=organization
    )
    if group_name:
        group, _ = Group.objects.get_or_create(name=group_name)
        user.groups.set([group])
    return organization, user


def empty_organization(organization) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM knowledge_knowledgechunk WHERE organization_id = %s", [organization.pk]
        )
        cursor.execute(
            "DELETE FROM knowledge_knowledgedocument WHERE source_id IN "
            "(SELECT id FROM knowledge_knowledgesource WHERE organization_id = %s)",
            [organization.pk],
        )
        cursor.execute(
            "DELETE FROM knowledge_knowledgesource WHERE organization_id = %s", [organization.pk]
        )


def percentile(values, share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


# --- 1. Quality and ingestion ---------------------------------------------------------------


def index_fixture(organization):
    from knowledge import chunking, embeddings, services
    from knowledge.principals import principal

    empty_organization(organization)
    source = services.source_create(
        organization=organization,
        name="Handbook",
        default_access=[principal("org", organization.pk)],
    )
    files = sorted((FIXTURE / "documents").glob("*.md"))
    embeddings.get_embedder()  # loaded once per process; not ingestion's cost
    started = time.perf_counter()
    slugs = {}
    for path in files:
        document = services.document_put_content(
            source=source, name=path.name, data=path.read_bytes()
        )
        if services.document_index(document.pk) is None:
            document.refresh_from_db()
            raise SystemExit(f"{path.name} was not indexed: {document.error}")
        slugs[document.pk] = path.stem
    seconds = time.perf_counter() - started
    # The same passages the indexing embedded (titles aside), embedded alone.
    passages = [
        passage for path in files for passage in chunking.chunk_text(path.stem, path.read_text())
    ]
    embed_started = time.perf_counter()
    embeddings.get_embedder().embed_passages(passages)
    embed_seconds = time.perf_counter() - embed_started
    print(
        f"ingestion: {len(files)} documents, {len(passages)} passages in {seconds:.1f} s: "
        f"{len(files) / seconds:.2f} documents/s, {len(passages) / seconds:.1f} passages/s; "
        f"embedding alone {len(passages) / embed_seconds:.1f} passages/s "
        f"({embed_seconds / seconds:.0%} of the time)"
    )
    return slugs


def ndcg_at_10(ranked: list[str], judged: dict[str, int]) -> float:
    gain = sum(
        (2 ** judged.get(slug, 0) - 1) / math.log2(i + 2) for i, slug in enumerate(ranked[:10])
    )
    ideal = sorted(judged.values(), reverse=True)[:10]
    best = sum((2**grade - 1) / math.log2(i + 2) for i, grade in enumerate(ideal))
    return gain / best


def recall_at_10(ranked: list[str], judged: dict[str, int]) -> float:
    return len(set(ranked[:10]) & set(judged)) / len(judged)


def reciprocal_rank(ranked: list[str], judged: dict[str, int]) -> float:
    for i, slug in enumerate(ranked[:10]):
        if judged.get(slug) == 2:
            return 1 / (i + 1)
    return 0.0


def rank_three_ways(user, query: str, slugs: dict[int, str]) -> dict[str, list[str]]:
    from django.db import transaction

    from knowledge import embeddings, search
    from knowledge.principals import principals_for

    embedder = embeddings.get_embedder()
    principals = principals_for(user)
    chunks = search.readable_chunks(principals, user.membership.organization_id)
    with transaction.atomic():
        words = search.best_chunks_by_words(chunks, search.words_of(query), 10)
        meaning = search.best_chunks_by_meaning(
            chunks,
            embedder.embed_query(query),
            embedder.name,
            10,
            search.readable_share(principals),
        )
    hybrid = search.search_for_user(user, query, limit=10)
    return {
        "full-text": [slugs[document_id] for document_id, _ in words],
        "vector": [slugs[document_id] for document_id, _ in meaning],
        "hybrid": [slugs[result.document_id] for result in hybrid],
    }


def quality() -> None:
    organization, user = reader("knowledge-bench-quality", "quality@knowledge-bench.test")
    slugs = index_fixture(organization)
    queries = json.loads((FIXTURE / "queries.json").read_text())
    scores = {}  # (way, kind) -> list of (ndcg, recall, rr)
    for query in queries:
        for way, ranked in rank_three_ways(user, query["query"], slugs).items():
            judged = query["relevant"]
            figures = (ndcg_at_10(ranked, judged), recall_at_10(ranked, judged),
                       reciprocal_rank(ranked, judged))  # fmt: skip
            scores.setdefault((way, query["kind"]), []).append(figures)
            scores.setdefault((way, "all"), []).append(figures)
    kinds = ["all", *sorted({query["kind"] for query in queries})]
    print(f"\nquality on {len(queries)} judged queries (nDCG@10 / recall@10 / MRR):")
    headers = [f"{kind} ({len(scores[('hybrid', kind)])})" for kind in kinds]
    print(f"{'':>10}" + "".join(f"{header:>24}" for header in headers))
    for way in ("full-text", "vector", "hybrid"):
        cells = []
        for kind in kinds:
            columns = zip(*scores[(way, kind)], strict=True)
            ndcg, recall, rr = (statistics.fmean(column) for column in columns)
            cells.append(f"{ndcg:.3f} / {recall:.3f} / {rr:.3f}")
        print(f"{way:>10}" + "".join(f"{cell:>24}" for cell in cells))


# --- 2. Scale ---------------------------------------------------------------------------------


MANUALS = Path("/usr/share/man")
# Real embeddings of manual passages: hours of CPU at 100 000, so kept across runs and
# reboots (--embed-manuals).
EMBEDDINGS_CACHE = Path("/var/tmp/quor-bench-knowledge/manual-embeddings")  # noqa: S108
EMBEDDING_BLOCK = 1000
COPIED_SHARE = 0.01  # with --text manuals: passages whose text is a fixture passage's
UNINDEXED = "quor-bench-unindexed"  # the search vector of a manual passage until updated
_GROFF_ESCAPE = re.compile(r"\\(f\[[^]]*\]|f\(..|f.|\(..|\*\(..|\*\[[^]]*\]|\*.|s[-+]?\d|.)")


def manual_passages(count: int) -> list[str]:
    """`count` passages of about 120 words from this machine's manual pages, their groff
    markup stripped: real technical text, for a words ranking that meets a vocabulary as
    varied as a company's, where copies of the fixture repeat its few hundred passages'
    words and pairs of words hundreds of times."""
    passages, words = [], []
    for path in sorted(MANUALS.glob("man*/*.gz")):
        try:
            source = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        for line in source.splitlines():
            if line.startswith(('.\\"', "'\\\"")):
                continue
            if line.startswith("."):
                line = line.partition(" ")[2]
            words.extend(_GROFF_ESCAPE.sub(" ", line).split())
            while len(words) >= 120:
                passages.append(" ".join(words[:120]))
                del words[:120]
                if len(passages) == count:
                    return passages
    raise SystemExit(f"{MANUALS} holds {len(passages)} passages of text, not {count}")


def _embed_block(texts: list[str]):
    from knowledge import embeddings

    return embeddings.get_embedder().embed_passages(texts)


def embed_manual_passages(count: int, processes: int) -> None:
    """Fills the cache of the first `count` manual passages' real embeddings, in blocks
    named by their texts' hash (a block of changed manual pages is embedded again).
    Resumable: a run stopped midway keeps the blocks it finished."""
    from concurrent.futures import ProcessPoolExecutor

    import numpy

    from knowledge import embeddings

    EMBEDDINGS_CACHE.mkdir(parents=True, exist_ok=True)
    passages = manual_passages(_whole_blocks(count))
    blocks = [
        (path, passages[start : start + EMBEDDING_BLOCK])
        for start in range(0, len(passages), EMBEDDING_BLOCK)
        if not (path := _block_path(start, passages, embeddings.MODEL_NAME)).exists()
    ]
    print(f"{len(passages)} manual passages: {len(blocks)} blocks of {EMBEDDING_BLOCK} to embed")
    started = time.perf_counter()
    with ProcessPoolExecutor(processes) as pool:
        done = pool.map(_embed_block, [texts for _, texts in blocks])
        paths = [path for path, _ in blocks]
        for number, (path, vectors) in enumerate(zip(paths, done, strict=True), 1):
            partial = path.with_suffix(".partial")
            with partial.open("wb") as file:
                numpy.save(file, vectors)
            partial.rename(path)
            rate = number * EMBEDDING_BLOCK / (time.perf_counter() - started)
            print(f"  block {number}/{len(blocks)}: {rate:.1f} passages/s", flush=True)


def _whole_blocks(count: int) -> int:
    return -(-count // EMBEDDING_BLOCK) * EMBEDDING_BLOCK


def _block_path(start: int, passages: list[str], model: str) -> Path:
    texts = "\0".join(passages[start : start + EMBEDDING_BLOCK]).encode()
    return EMBEDDINGS_CACHE / f"{model}-{start:07d}-{hashlib.sha256(texts).hexdigest()[:16]}.npy"


def manual_embeddings(count: int):
    """The real embeddings of the first `count` manual passages, from the cache."""
    import numpy

    from knowledge import embeddings

    passages = manual_passages(_whole_blocks(count))
    vectors = []
    for start in range(0, count, EMBEDDING_BLOCK):
        path = _block_path(start, passages, embeddings.MODEL_NAME)
        if not path.exists():
            raise SystemExit(
                f"no cached embeddings of manual passages {start}+: run "
                f"bench/knowledge.py --embed-manuals {count} first"
            )
        vectors.append(numpy.load(path)[: count - start])
    return numpy.concatenate(vectors)


def manual_queries(size: int, count: int) -> list[str]:
    """Queries for real embeddings: words 10 to 21 of `count` manual passages spread over
    the first `size` (the fixture's queries are about other things)."""
    passages = manual_passages(size)
    step = max(1, size // count)
    return [" ".join(passages[i].split()[10:22]) for i in range(0, size, step)][:count]


def grow_synthetic_passages(
    organization, size: int, text: str, rebuild: bool, real_embeddings: bool
) -> float:
    """Adds synthetic passages until the organization has `size`; returns the seconds the
    HNSW index took to build over the whole table (dropped for the load, or with
    `rebuild` for a new build alone: HNSW graphs differ from build to build). Their text
    is a fixture passage's (`copies`), or with `manuals` a manual page's for all but
    COPIED_SHARE of them. With `real_embeddings` every passage is a manual page's with its
    own embedding (embed_manual_passages): no copies, whose identical vectors would tie."""
    import numpy
    from django.contrib.auth.models import Group
    from django.db import connection

    from knowledge import embeddings, services
    from knowledge.models import KnowledgeChunk, KnowledgeDocument, KnowledgeSource
    from knowledge.principals import principal

    groups = {name: Group.objects.get_or_create(name=f"bench-{name}")[0] for name in SELECTIVITIES}
    source = KnowledgeSource.objects.filter(organization=organization).first()
    source = source or services.source_create(organization=organization, name="Synthetic")
    originals = list(
        KnowledgeChunk.objects.exclude(organization=organization)
        .filter(embedding__isnull=False)
        .extra(select={"vector_text": "search_vector::text"})
        .values_list("text", "vector_text", "embedding")
    )
    if not originals:
        raise SystemExit("no fixture passages to copy: run once without --skip-quality")
    # Not the hidden passages of timing_of_hidden_matches, which nobody may read.
    have = KnowledgeChunk.objects.filter(organization=organization).exclude(access=[]).count()
    if have >= size and not rebuild:
        return 0.0
    if have > size:
        raise SystemExit(f"the table holds {have} synthetic passages, more than {size}")
    rng = numpy.random.default_rng([18, have])  # passages added later draw their own
    # The model's definition of the index: a run cut short here left the table without it.
    (nearest,) = [index for index in KnowledgeChunk._meta.indexes if index.name.endswith("nearest")]
    with connection.schema_editor() as editor:
        index_definition = str(nearest.create_sql(KnowledgeChunk, editor))
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX IF EXISTS knowledge_chunk_nearest")
    model = embeddings.get_embedder().name
    # From the first passage on for every size, so that one run's sizes share none.
    manuals = iter(manual_passages(size)[have:]) if text == "manuals" and have < size else None
    real = iter(manual_embeddings(size)[have:]) if real_embeddings and have < size else None
    for first in range(have, size, CHUNKS_PER_DOCUMENT):
        count = min(CHUNKS_PER_DOCUMENT, size - first)
        document = KnowledgeDocument.objects.create(
            source=source, external_id=f"synthetic-{first}", title=f"Synthetic {first}",
            url="", content_type="markdown", content_sha256="0" * 64, size=0,
            access=[principal("org", organization.pk)], state=KnowledgeDocument.State.INDEXED,
        )  # fmt: skip
        rows = io.StringIO()
        texts = [next(manuals) for _ in range(count)] if manuals else []
        own_vectors = [next(real) for _ in range(count)] if real else []
        for position in range(count):
            passage, vector_text, embedding = originals[rng.integers(len(originals))]
            moved = numpy.asarray(embedding)
            if texts and (own_vectors or rng.random() >= COPIED_SHARE):
                passage, vector_text = texts[position], None
                if own_vectors:
                    moved = own_vectors[position]
            if not own_vectors:
                other = originals[rng.integers(len(originals))][2]
                share = rng.uniform(0.5, 1.0)
                moved = share * moved + (1 - share) * numpy.asarray(other)
                moved += rng.normal(0, NOISE, len(embedding))
                moved /= numpy.linalg.norm(moved)
            access = [
                principal("group", groups[name].pk)
                for name, share in SELECTIVITIES.items()
                if rng.random() < share
            ]
            rows.write("\t".join([
                str(document.pk), str(organization.pk), str(source.pk), "markdown",
                str(position), _copy_text(passage),
                _copy_text(vector_text if vector_text is not None else UNINDEXED),
                "[" + ",".join(f"{value:.7f}" for value in moved) + "]", model,
                "{" + ",".join(access) + "}",
            ]) + "\n")  # fmt: skip
        with (
            connection.cursor() as cursor,
            cursor.copy(
                "COPY knowledge_knowledgechunk (document_id, organization_id, source_id, "
                "content_type, position, text, search_vector, embedding, embedding_model, access) "
                "FROM STDIN"
            ) as copy,
        ):
            copy.write(rows.getvalue())
    with connection.cursor() as cursor:  # the manual pages' text, as Quor indexes it
        cursor.execute(
            "UPDATE knowledge_knowledgechunk SET search_vector = to_tsvector(%s::regconfig, text) "
            "WHERE organization_id = %s AND search_vector = %s::tsvector",
            [services.SEARCH_CONFIG, organization.pk, UNINDEXED],
        )
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '1GB'")
        cursor.execute(index_definition)
    build = time.perf_counter() - started
    with connection.cursor() as cursor:
        # What autovacuum does to a real table by then: the passages of a smaller run
        # deleted, the text indexed again, are dead rows the indexes still point to.
        cursor.execute("VACUUM ANALYZE knowledge_knowledgechunk")
    return build


def _copy_text(value: str) -> str:
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


def nearest_documents(user, query_vector, plan: str) -> list[int]:
    """The vector ranking's top 10 (document, chunk) as search_for_user computes it, with
    the plan the planner picks, the HNSW index forced, or no index (exact)."""
    from django.db import connection, transaction

    from knowledge import embeddings, search
    from knowledge.principals import principals_for

    settings = {
        "planner": [],
        "hnsw": ["enable_seqscan", "enable_bitmapscan", "enable_sort"],
        "exact": ["enable_indexscan"],
    }[plan]
    with transaction.atomic():
        with connection.cursor() as cursor:
            for setting in settings:
                cursor.execute(f"SET LOCAL {setting} = off")
        principals = principals_for(user)
        chunks = search.readable_chunks(principals, user.membership.organization_id)
        return search.best_chunks_by_meaning(
            chunks,
            query_vector,
            embeddings.get_embedder().name,
            10,
            search.readable_share(principals),
        )


def distances_of(chunk_ids: list[int], query_vector) -> dict[int, float]:
    from django.db.models import F
    from pgvector.django import CosineDistance

    from knowledge.models import KnowledgeChunk

    return dict(
        KnowledgeChunk.objects.filter(pk__in=chunk_ids)
        .annotate(distance=CosineDistance(F("embedding"), query_vector))
        .values_list("pk", "distance")
    )


def recall_of(found, exact, query_vector) -> tuple[float, float]:
    """Recall@10 of `found` against `exact` (lists of (document, chunk)), strict and as
    ann-benchmarks counts it: a found passage counts when it is no farther than the
    exact tenth plus TIE_TOLERANCE, so a tie broken the other way is not a miss."""
    distance = distances_of([chunk for _, chunk in found + exact], query_vector)
    strict = len(set(found) & set(exact)) / len(exact)
    tenth = distance[exact[-1][1]]
    within = sum(1 for _, chunk in found if distance[chunk] <= tenth + TIE_TOLERANCE)
    return strict, min(within, len(exact)) / len(exact)


def rows_read(user) -> int:
    """The rows the vector ranking reads from the HNSW index scan for `user`."""
    from knowledge import search
    from knowledge.principals import principals_for

    return search.rows_to_read(search.readable_share(principals_for(user)))


def vector_plan(user, query_vector) -> str:
    from django.db import connection, reset_queries, transaction
    from django.test.utils import CaptureQueriesContext

    reset_queries()
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        nearest_documents(user, query_vector, "planner")
    statements = [q["sql"] for q in queries.captured_queries if "<=>" in q["sql"]]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        cursor.execute("EXPLAIN " + statements[0])
        plan = " ".join(line for (line,) in cursor.fetchall())
    label = "HNSW" if "knowledge_chunk_nearest" in plan else "exact (access index, sort)"
    return label + (", then exact" if len(statements) > 1 else "")


def scale(
    sizes: list[int], rounds: int, text: str, keep_passages: bool, real_embeddings: bool
) -> None:
    from django.db import connection, reset_queries

    from knowledge import embeddings, search

    organization, _ = reader("knowledge-bench-scale", "scale-all@knowledge-bench.test")
    if not keep_passages:
        empty_organization(organization)
    readers = {
        name: reader(
            "knowledge-bench-scale", f"scale-{name}@knowledge-bench.test", f"bench-{name}"
        )[1]
        for name in SELECTIVITIES
    }
    queries = [query["query"] for query in json.loads((FIXTURE / "queries.json").read_text())]
    embedder = embeddings.get_embedder()
    for size in sizes:
        if real_embeddings:
            queries = manual_queries(size, len(queries))
        vectors = [embedder.embed_query(query) for query in queries]
        build = grow_synthetic_passages(organization, size, text, keep_passages, real_embeddings)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT relname, pg_relation_size(oid) FROM pg_class WHERE relname IN "
                "('knowledge_knowledgechunk', 'knowledge_chunk_nearest', "
                "'knowledge_chunk_search', 'knowledge_chunk_access')"
            )
            sizes_mb = {name: size_bytes / 2**20 for name, size_bytes in cursor.fetchall()}
            cursor.execute("SELECT count(*) FROM knowledge_knowledgechunk")
            (total,) = cursor.fetchone()
        print(f"\n{size} synthetic passages ({total} in the table); HNSW build {build:.1f} s")
        print(
            "  sizes (MiB): "
            + ", ".join(f"{name} {mb:.1f}" for name, mb in sorted(sizes_mb.items()))
        )
        print(f"  {'reader':>11} {'reads':>7} {'plan':>34} {'rows':>5} {'recall@10 (ties)':>17}"
              f" {'HNSW forced':>14} {'search p50':>11} {'p95 (ms)':>9}")  # fmt: skip
        for name, user in readers.items():
            recall, forced = [], []
            for vector in vectors:
                reset_queries()  # QUOR_DEBUG keeps every statement otherwise
                exact = nearest_documents(user, vector, "exact")
                if not exact:
                    continue
                for plan, figures in (("planner", recall), ("hnsw", forced)):
                    found = nearest_documents(user, vector, plan)
                    figures.append(recall_of(found, exact, vector))
            timings = []
            for _ in range(rounds):
                for query in queries:
                    reset_queries()
                    started = time.perf_counter()
                    search.search_for_user(user, query)
                    timings.append(time.perf_counter() - started)
            print(
                f"  {name:>11} {SELECTIVITIES[name]:>7.1%} {vector_plan(user, vectors[0]):>34} "
                f"{rows_read(user):>5} {_recall_cell(recall):>17} {_recall_cell(forced):>14} "
                f"{percentile(timings, 0.5) * 1000:>11.1f} {percentile(timings, 0.95) * 1000:>9.1f}"
            )
    embed = []
    for query in queries * rounds:
        started = time.perf_counter()
        embedder.embed_query(query)
        embed.append(time.perf_counter() - started)
    print(f"\nquery embedding alone: p50 {percentile(embed, 0.5) * 1000:.1f} ms, "
          f"p95 {percentile(embed, 0.95) * 1000:.1f} ms")  # fmt: skip


def _recall_cell(figures: list[tuple[float, float]]) -> str:
    strict, tolerant = (statistics.fmean(column) for column in zip(*figures, strict=True))
    return f"{strict:.3f} ({tolerant:.3f})"


# --- 3. Timing ---------------------------------------------------------------------------------


def timing_of_hidden_matches(rounds: int) -> None:
    """Whether a query that matches only passages the caller may not read takes longer
    than one that matches nothing: 2 000 hidden passages with a word of their own in the
    scale organization, a reader of 1 % of it, the two queries interleaved."""
    from django.db import connection, reset_queries

    from knowledge import search

    organization, _ = reader("knowledge-bench-scale", "scale-all@knowledge-bench.test")
    user = reader(
        "knowledge-bench-scale", "scale-hundredth@knowledge-bench.test", "bench-hundredth"
    )[1]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM knowledge_knowledgechunk "
            "WHERE organization_id = %s AND text LIKE '%%quokkahidden%%'",
            [organization.pk],
        )
        if cursor.fetchone()[0] == 0:
            cursor.execute(
                "INSERT INTO knowledge_knowledgechunk (document_id, organization_id, source_id, "
                "content_type, position, text, search_vector, embedding, embedding_model, access) "
                "SELECT document_id, organization_id, source_id, content_type, position + 100000, "
                "text || ' quokkahidden', search_vector || to_tsvector('english', 'quokkahidden'), "
                "embedding, embedding_model, '{}' FROM knowledge_knowledgechunk "
                "WHERE organization_id = %s ORDER BY id LIMIT 2000",
                [organization.pk],
            )
            cursor.execute("ANALYZE knowledge_knowledgechunk")
    timings = {"quokkahidden": [], "quokkanowhere": []}
    for _ in range(rounds * 50):
        for query, values in timings.items():
            reset_queries()
            started = time.perf_counter()
            search.search_for_user(user, query)
            values.append(time.perf_counter() - started)
    print("\ntiming, a reader of 1 %: a query matching only 2 000 hidden passages vs nothing")
    for query, values in timings.items():
        print(
            f"  {query:>14}: p50 {percentile(values, 0.5) * 1000:.2f} ms, "
            f"p95 {percentile(values, 0.95) * 1000:.2f} ms"
        )


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return number


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--text", choices=["copies", "manuals"], default="copies")
    parser.add_argument(
        "--keep-passages",
        action="store_true",
        help="the synthetic passages of an earlier run (same --text), with a new HNSW build",
    )
    parser.add_argument(
        "--embeddings",
        choices=["synthetic", "real"],
        default="synthetic",
        help="real: manual passages' own embeddings (--text manuals, after --embed-manuals)",
    )
    parser.add_argument(
        "--embed-manuals",
        type=positive,
        metavar="COUNT",
        help="embed the first COUNT manual passages into the cache, then stop",
    )
    parser.add_argument("--processes", type=positive, default=1, help="for --embed-manuals")
    arguments = parser.parse_args()
    if arguments.embeddings == "real" and arguments.text != "manuals":
        parser.error("--embeddings real needs --text manuals")
    if arguments.keep_passages and "," in arguments.sizes:
        parser.error("--keep-passages measures one size")
    if arguments.embed_manuals is not None:
        embed_manual_passages(arguments.embed_manuals, arguments.processes)
        return
    setup()
    if not arguments.skip_quality:
        quality()
    if not arguments.skip_scale:
        sizes = [int(size) for size in arguments.sizes.split(",")]
        scale(
            sizes,
            arguments.rounds,
            arguments.text,
            arguments.keep_passages,
            arguments.embeddings == "real",
        )
        timing_of_hidden_matches(arguments.rounds)


if __name__ == "__main__":
    main()
