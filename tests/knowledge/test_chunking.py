from knowledge.chunking import MAX_WORDS, chunk_text


def words(n, word="alpha"):
    return " ".join(f"{word}{i}" for i in range(n))


def test_every_passage_starts_with_the_title_and_stays_within_the_word_budget():
    text = "\n\n".join(words(70, f"p{k}w") for k in range(10))
    passages = chunk_text("Travel policy", text)
    assert len(passages) > 3
    for passage in passages:
        assert passage.startswith("Travel policy\n")
        assert len(passage.split()) <= MAX_WORDS


def test_no_word_is_lost_or_repeated():
    text = "\n\n".join([words(500, "long"), words(3, "short"), words(90, "mid")])
    passages = chunk_text("T", text)
    body = [w for p in passages for w in p.split("\n", 1)[1].split()]
    assert body == text.split()


def test_paragraphs_that_fit_together_share_a_passage():
    assert chunk_text("Lunch", "Served at noon.") == ["Lunch\nServed at noon."]
    assert len(chunk_text("T", words(100) + "\n\n" + words(50, "b"))) == 1
    assert len(chunk_text("T", words(100) + "\n\n" + words(70, "b"))) == 2


def test_a_long_title_is_cut_to_a_quarter_of_a_passage_and_every_word_is_kept():
    passages = chunk_text(words(300, "title"), words(160))
    assert all(p.startswith(words(MAX_WORDS // 4, "title") + "\n") for p in passages)
    assert all(len(p.split()) <= MAX_WORDS for p in passages)
    assert [w for p in passages for w in p.split("\n", 1)[1].split()] == words(160).split()


def test_a_document_without_text_has_no_passage():
    assert chunk_text("", "  \n\n ") == []
