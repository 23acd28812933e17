"""Passages of a document, each small enough for a small embedding model (all-MiniLM
truncates at 256 word pieces; 160 words with the title stay under it for English) and
each starting with the document's title, so a title match finds every passage."""

import re

MAX_WORDS = 160

_PARAGRAPHS = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _pieces(text: str):
    """Paragraphs, and sentences (or runs of words) of paragraphs too long for one
    passage, each at most MAX_WORDS words."""
    for paragraph in _PARAGRAPHS.split(text):
        words = paragraph.split()
        if not words:
            continue
        if len(words) <= MAX_WORDS:
            yield words
            continue
        for sentence in _SENTENCE_END.split(paragraph):
            sentence_words = sentence.split()
            for start in range(0, len(sentence_words), MAX_WORDS):
                yield sentence_words[start : start + MAX_WORDS]


def passage_title(title: str) -> str:
    """The title as passages start with it: at most a quarter of a passage's words."""
    return " ".join(title.split()[: MAX_WORDS // 4])


def chunk_text(title: str, text: str) -> list[str]:
    title = passage_title(title)
    budget = MAX_WORDS - len(title.split())
    passages: list[list[str]] = []
    current: list[str] = []
    for words in _pieces(text):
        if current and len(current) + len(words) > budget:
            passages.append(current)
            current = []
        current.extend(words if len(words) <= budget else words[:budget])
        for start in range(budget, len(words), budget):
            passages.append(current)
            current = words[start : start + budget]
    if current:
        passages.append(current)
    if not passages:
        return [title] if title.strip() else []
    return [f"{title}\n{' '.join(words)}" for words in passages]
