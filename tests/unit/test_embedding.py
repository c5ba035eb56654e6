from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import texts as odd_texts
from worker.models import hashing
from worker.models.factory import load_embedder
from worker.models.hashing import SHORT_TEXT_WORDS, STOP_WORDS, Embedder, HashingEmbedder

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = "Deploy the auth service to production; rollback if the health check fails."
RELATED_SENTENCES = [
    (
        "User authentication fails after the token expires",
        "Auth failure when the login token has expired",
        "The cat sat on the warm windowsill all afternoon",
    ),
    (
        "Deploy the service to production with Docker",
        "Production deployment of the service uses Docker containers",
        "Grandma's apple pie recipe needs cinnamon and butter",
    ),
    (
        "The database migration failed on the users table",
        "Migrating the users table in the database failed",
        "The quarterly sales report shows strong growth in Europe",
    ),
    (
        "Redis connection refused on port 6379",
        "cannot connect to redis: connection refused",
        "She painted the fence blue last summer",
    ),
]


class TinyEmbedder:
    name = "tiny-d4"
    dim = 4

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.tile(np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32), (len(texts), 1))


class Nameless:
    dim = 4

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.zeros((len(texts), 4), dtype=np.float32)


def make_tiny() -> TinyEmbedder:
    return TinyEmbedder()


def make_nameless() -> Nameless:
    return Nameless()


def make_dimless() -> object:
    class Dimless:
        name = "dimless"

        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            return np.zeros((len(texts), 1), dtype=np.float32)

    return Dimless()


def make_embedless() -> object:
    class Embedless:
        name = "embedless"
        dim = 4

    return Embedless()


NOT_A_FACTORY = 42
#: words a query is made of: stop words, repeats of a few, long ones, unicode ones, digits
QUERY_WORDS = [
    *sorted(STOP_WORDS)[:12],
    "deploy",
    "deployment",
    "redis",
    "auth",
    "x",
    "42",
    "na\u00efve",
    "stra\u00dfe",
    "\u65e5\u672c\u8a9e",
    "\u0130stanbul",
    "supercalifragilisticexpialidocious-and-then-some",
    "a" * 70,
]
query_texts = st.lists(
    st.sampled_from(QUERY_WORDS) | st.text(min_size=1, max_size=12), max_size=SHORT_TEXT_WORDS + 4
).map(" ".join)


def cosine(embedder: Embedder, left: str, right: str) -> float:
    vectors = embedder.embed([left, right])
    return float(vectors[0] @ vectors[1])


def assert_rows_unit_or_zero(vectors: npt.NDArray[np.float32]) -> None:
    norms = np.linalg.norm(vectors, axis=1)
    assert np.all(np.isfinite(vectors))
    assert np.all(np.isclose(norms, 1.0, atol=1e-5) | (norms == 0.0))


def test_embed_returns_float32_c_contiguous_unit_rows() -> None:
    vectors = HashingEmbedder(64).embed([SAMPLE, "a second, different note", "x"])
    assert vectors.shape == (3, 64)
    assert vectors.dtype == np.float32
    assert vectors.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_default_dim_is_256() -> None:
    assert HashingEmbedder().dim == 256
    assert HashingEmbedder().embed([SAMPLE]).shape == (1, 256)


def test_empty_and_whitespace_texts_give_zero_rows() -> None:
    vectors = HashingEmbedder(32).embed(["", SAMPLE, "   \t\n", "!!! ..."])
    assert not vectors[[0, 2, 3]].any()
    assert np.linalg.norm(vectors[1]) == pytest.approx(1.0, abs=1e-5)


def test_empty_batch_gives_zero_by_dim_array() -> None:
    vectors = HashingEmbedder(48).embed([])
    assert vectors.shape == (0, 48)
    assert vectors.dtype == np.float32


def test_text_of_only_stop_words_still_embeds() -> None:
    assert np.linalg.norm(HashingEmbedder(32).embed(["to be or not to be"])) > 0


def test_two_instances_give_identical_bytes() -> None:
    first = HashingEmbedder(128).embed([SAMPLE, "another note"])
    second = HashingEmbedder(128).embed([SAMPLE, "another note"])
    assert first.tobytes() == second.tobytes()


@pytest.mark.parametrize("hash_seed", ["1", "4242"])
def test_vectors_do_not_depend_on_pythonhashseed(hash_seed: str) -> None:
    code = (
        "import sys; from worker.models.hashing import HashingEmbedder; "
        f"sys.stdout.write(HashingEmbedder(128).embed([{SAMPLE!r}])[0].tobytes().hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout == HashingEmbedder(128).embed([SAMPLE])[0].tobytes().hex()


def test_row_does_not_depend_on_the_rest_of_the_batch() -> None:
    embedder = HashingEmbedder(64)
    texts = [SAMPLE, "", "deploy deploy deploy again", "one", SAMPLE.upper()]
    batch = embedder.embed(texts)
    for text, row in zip(texts, batch, strict=True):
        assert row.tobytes() == embedder.embed([text])[0].tobytes()


@settings(max_examples=400, deadline=None)
@given(query_texts | odd_texts, st.sampled_from([8, 64, 256]))
def test_one_short_text_embeds_to_the_bits_of_the_batch_path(text: str, dim: int) -> None:
    embedder = HashingEmbedder(dim)
    one = embedder.embed([text])
    assert one.shape == (1, dim)
    assert one.flags.c_contiguous
    assert one.tobytes() == embedder.embed([text, SAMPLE])[:1].tobytes()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(QUERY_WORDS), min_size=1, max_size=3), st.integers(2, 8))
def test_repeated_words_damp_alike_on_both_paths(words: list[str], times: int) -> None:
    embedder = HashingEmbedder(64)
    text = " ".join(words * times)
    assert embedder.embed([text]).tobytes() == embedder.embed([text, ""])[:1].tobytes()


def test_case_and_punctuation_do_not_change_the_vector() -> None:
    embedder = HashingEmbedder(64)
    vectors = embedder.embed(["Deploy, the SERVICE!", "deploy the service"])
    np.testing.assert_array_equal(vectors[0], vectors[1])


def test_word_order_matters_through_bigrams() -> None:
    embedder = HashingEmbedder(256)
    assert cosine(embedder, "redis connection refused", "refused connection redis") < 0.999


@pytest.mark.parametrize(("anchor", "related", "unrelated"), RELATED_SENTENCES)
def test_related_sentences_are_clearly_closer_than_unrelated(
    anchor: str, related: str, unrelated: str
) -> None:
    embedder = HashingEmbedder(256)
    assert cosine(embedder, anchor, related) > cosine(embedder, anchor, unrelated) + 0.2


@pytest.mark.parametrize(
    ("word", "stem_mate", "stranger"),
    [("deploy", "deployment", "banana"), ("auth", "authentication", "weather")],
)
def test_words_sharing_a_stem_are_closer_than_strangers(
    word: str, stem_mate: str, stranger: str
) -> None:
    embedder = HashingEmbedder(256)
    assert cosine(embedder, word, stem_mate) > cosine(embedder, word, stranger) + 0.15


def test_name_changes_with_dim() -> None:
    assert HashingEmbedder(128).name != HashingEmbedder(256).name
    assert HashingEmbedder(256).name == HashingEmbedder(256).name


def test_non_positive_dim_is_rejected() -> None:
    with pytest.raises(ValueError, match="dim"):
        HashingEmbedder(0)


@given(st.lists(st.text(), max_size=8))
def test_any_unicode_texts_embed_to_unit_or_zero_rows(texts: list[str]) -> None:
    vectors = HashingEmbedder(32).embed(texts)
    assert vectors.shape == (len(texts), 32)
    assert vectors.dtype == np.float32
    assert_rows_unit_or_zero(vectors)


def test_load_embedder_hash_builds_a_hashing_embedder_of_that_dim() -> None:
    embedder = load_embedder("hash", 64)
    assert isinstance(embedder, HashingEmbedder)
    assert embedder.dim == 64
    assert embedder.embed([SAMPLE]).shape == (1, 64)


def test_load_embedder_import_path_calls_the_factory() -> None:
    embedder = load_embedder("tests.unit.test_embedding:make_tiny", 256)
    assert isinstance(embedder, TinyEmbedder)
    assert embedder.name == "tiny-d4"
    assert embedder.embed(["x", "y"]).shape == (2, 4)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sentence-transformers", "unknown embedder spec"),
        ("", "unknown embedder spec"),
        (":make_tiny", "unknown embedder spec"),
        ("tests.unit.test_embedding:", "unknown embedder spec"),
        ("zq_no_such_module.sub:make", "cannot import"),
        ("tests.unit.test_embedding:make_nothing", "missing or not callable"),
        ("tests.unit.test_embedding:NOT_A_FACTORY", "missing or not callable"),
        ("tests.unit.test_embedding:make_nameless", "name"),
        ("tests.unit.test_embedding:make_dimless", "dim"),
        ("tests.unit.test_embedding:make_embedless", "embed"),
    ],
)
def test_load_embedder_rejects_bad_specs_with_value_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_embedder(spec, 64)


def reference_features(word: str, dim: int) -> tuple[list[int], list[float], int]:
    """A word's features as the module docstring defines them, one feature at a time."""
    padded = f"<{word[: hashing.MAX_CHARGRAM_WORD_CHARS]}>"
    grams = [padded[i : i + n] for n in hashing.CHARGRAM_SIZES for i in range(len(padded) - n + 1)]
    boosts = np.array([hashing.PREFIX_BOOST if gram[0] == "<" else 1.0 for gram in grams])
    weights = [hashing.WORD_WEIGHT, *(boosts * hashing.CHARGRAM_WEIGHT / np.linalg.norm(boosts))]
    names = [f"w:{word}", *(f"c:{gram}" for gram in grams)]
    digests = [
        hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        for name in names
    ]
    hashes = [int.from_bytes(digest, "little") for digest in digests]
    signed = [weight if h >> 63 else -weight for h, weight in zip(hashes, weights, strict=True)]
    return [h % dim for h in hashes], signed, hashes[0]


@settings(max_examples=300, deadline=None)
@given(query_texts | odd_texts, st.sampled_from([8, 256]))
def test_word_features_are_those_of_their_definition(text: str, dim: int) -> None:
    for word in hashing._words(text):
        indices, weights, word_hash = hashing._word_features(word, dim)
        assert (indices.tolist(), weights.tolist(), word_hash) == reference_features(word, dim)
