"""The judged retrieval fixture (bench/knowledge_fixture) is well formed.

Django-free: run with `pytest -p no:django --noconftest`."""

import json
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[2] / "bench" / "knowledge_fixture"
DOCUMENTS = FIXTURE / "documents"
KINDS = {"lexical", "semantic", "mixed"}
MIN_WORDS, MAX_WORDS = 150, 900


@cache
def documents() -> dict[str, str]:
    return {path.stem: path.read_text(encoding="utf-8") for path in DOCUMENTS.glob("*.md")}


@cache
def queries() -> list[dict]:
    return json.loads((FIXTURE / "queries.json").read_text(encoding="utf-8"))


def test_there_are_enough_documents_and_queries():
    assert len(documents()) >= 60
    assert len(queries()) >= 50


def test_the_documents_folder_holds_only_markdown_documents():
    assert {path.suffix for path in DOCUMENTS.iterdir()} == {".md"}


@pytest.mark.parametrize("slug", sorted(documents()))
def test_every_document_has_a_title_line_and_a_sensible_length(slug):
    text = documents()[slug]
    first_line = text.split("\n", 1)[0]
    assert first_line.startswith("# ")
    assert first_line[2:].strip()
    assert MIN_WORDS <= len(text.split()) <= MAX_WORDS


def test_queries_have_the_expected_shape():
    for query in queries():
        assert set(query) == {"id", "query", "kind", "relevant"}, query
        assert isinstance(query["query"], str) and query["query"].strip(), query
        assert isinstance(query["relevant"], dict) and query["relevant"], query


def test_query_ids_and_texts_are_unique():
    ids = Counter(query["id"] for query in queries())
    texts = Counter(query["query"].strip().lower() for query in queries())
    assert [i for i, n in ids.items() if n > 1] == []
    assert [t for t, n in texts.items() if n > 1] == []


def test_every_judged_slug_is_a_document():
    slugs = set(documents())
    missing = {
        (query["id"], slug)
        for query in queries()
        for slug in query["relevant"]
        if slug not in slugs
    }
    assert missing == set()


def test_grades_are_one_or_two():
    bad = {
        (query["id"], slug, grade)
        for query in queries()
        for slug, grade in query["relevant"].items()
        if type(grade) is not int or grade not in (1, 2)
    }
    assert bad == set()


def test_every_query_has_a_document_that_answers_it():
    unanswered = [query["id"] for query in queries() if 2 not in query["relevant"].values()]
    assert unanswered == []


def test_kinds_are_known_and_each_has_at_least_15_queries():
    kinds = Counter(query["kind"] for query in queries())
    assert set(kinds) <= KINDS
    for kind in KINDS:
        assert kinds[kind] >= 15, kinds
