"""The offline embedder with the real model (no Django: run with
`pytest -p no:django --noconftest tests/knowledge/test_embeddings.py`)."""

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest

from knowledge import embeddings

SECURITY_REVIEW = "The quarterly security review covers document permissions."
PARAPHRASE = "Access rights to files are audited every three months."
LUNCH_MENU = "Today's lunch menu: tomato soup, grilled cheese sandwiches and apple pie."


@pytest.fixture(scope="module")
def embedder():
    return embeddings.get_embedder()


def assert_unit_rows(vectors):
    assert numpy.allclose(numpy.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(embedder):
    review, paraphrase, lunch = embedder.embed_passages([SECURITY_REVIEW, PARAPHRASE, LUNCH_MENU])
    assert review @ paraphrase > 0.4
    assert review @ lunch < 0.15
    assert embedder.embed_query(PARAPHRASE) @ review > review @ lunch + 0.3


def test_vectors_have_the_model_shape_dtype_and_unit_length(embedder):
    assert embedder.name == "all-MiniLM-L6-v2-int8"
    assert embedder.dimensions == 384
    passages = embedder.embed_passages([SECURITY_REVIEW, PARAPHRASE])
    assert passages.shape == (2, 384)
    assert passages.dtype == numpy.float32
    assert_unit_rows(passages)
    query = embedder.embed_query(SECURITY_REVIEW)
    assert query.shape == (384,)
    assert query.dtype == numpy.float32
    assert_unit_rows(query)


def test_no_passages_give_an_empty_matrix(embedder):
    passages = embedder.embed_passages([])
    assert passages.shape == (0, 384)
    assert passages.dtype == numpy.float32


def test_a_long_text_is_cut_at_256_word_pieces_not_rejected(embedder):
    start = "security review " * 100  # 200 word pieces
    long_text = start + "quarterly audit " * 2400
    assert len(long_text.split()) == 5000
    differs_after_280_pieces = start + "quarterly audit " * 40 + "lunch menu " * 2400
    differs_after_200_pieces = start + "lunch menu " * 2440
    long_vector, same_start, other_end = embedder.embed_passages(
        [long_text, differs_after_280_pieces, differs_after_200_pieces]
    )
    assert_unit_rows(long_vector)
    assert numpy.allclose(long_vector, same_start, atol=1e-6)
    # Word pieces 200 to 255 still count (the tokenizer file's own limit is 128).
    assert long_vector @ other_end < 0.99


def test_a_batch_gives_the_same_vectors_as_one_text_at_a_time(embedder):
    texts = [f"{SECURITY_REVIEW} Item {number}. " * (1 + number % 4) for number in range(11)]
    texts += [PARAPHRASE, LUNCH_MENU]
    assert len(texts) > embeddings.PASSAGE_BATCH_SIZE
    in_batches = embedder.embed_passages(texts)
    one_at_a_time = numpy.stack([embedder.embed_query(text) for text in texts])
    assert numpy.allclose(in_batches, one_at_a_time, atol=1e-5)


@pytest.mark.parametrize("text", ["", "   \n\t", "\x00\x01"])
def test_text_without_words_is_refused(embedder, text):
    with pytest.raises(ValueError, match="text 0 has no words"):
        embedder.embed_query(text)
    with pytest.raises(ValueError, match="text 1 has no words"):
        embedder.embed_passages([SECURITY_REVIEW, text])


def test_one_string_is_not_taken_for_a_list_of_passages(embedder):
    with pytest.raises(TypeError):
        embedder.embed_passages(SECURITY_REVIEW)


def test_a_model_file_with_another_hash_is_refused(tmp_path):
    model_file = tmp_path / "model.onnx"
    model_file.write_bytes(b"pretend model weights")
    pinned_sha256 = hashlib.sha256(b"pretend model weights").hexdigest()
    assert embeddings.read_verified_model(model_file, pinned_sha256) == b"pretend model weights"
    model_file.write_bytes(b"pretend model weightz")
    with pytest.raises(embeddings.EmbeddingModelError, match="refusing to load it"):
        embeddings.read_verified_model(model_file, pinned_sha256)


def test_threads_share_one_embedder_loaded_once(monkeypatch, embedder):
    monkeypatch.setattr(embeddings, "_embedder", None)
    start_together = threading.Barrier(4)

    def get_embedder_at_once(_):
        start_together.wait()
        return embeddings.get_embedder()

    with ThreadPoolExecutor(max_workers=4) as pool:
        embedders = list(pool.map(get_embedder_at_once, range(4)))
    assert all(each is embedders[0] for each in embedders)
    assert embeddings.get_embedder() is embedders[0]
    assert embedders[0] is not embedder
