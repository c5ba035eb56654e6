"""Text embedders: the `Embedder` protocol, its errors and the offline `HashingEmbedder`.

`HashingEmbedder` needs no model and no download. Each text becomes a bag of features, each
hashed (feature hashing with a +/-1 sign) into one of `dim` buckets:

- word: lowercased unicode words minus STOP_WORDS, weight WORD_WEIGHT (words matter most);
- bigram: adjacent pairs of those words, weight BIGRAM_WEIGHT;
- chargram: 3-5 character n-grams of "<word>", sharing CHARGRAM_WEIGHT (L2) per word, so
  stems match ("deploy" / "deployment", "auth" / "authentication").

Word and bigram counts are damped to 1 + log(tf) and every row is L2 normalised. Hashes come
from blake2b, so vectors are identical across processes, machines and `PYTHONHASHSEED`s. One
short text (a query) is summed with fewer numpy calls than a batch, in the same order, so its
vector has the same bits as in a batch.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

#: bump whenever HashingEmbedder would produce different vectors for the same input
HASHING_VERSION = 1
#: weight of a word feature; words matter most
WORD_WEIGHT = 1.0
#: weight of a word-bigram feature
BIGRAM_WEIGHT = 0.5
#: L2 norm of the character n-gram block contributed by one word
CHARGRAM_WEIGHT = 0.8
#: extra weight of the n-grams that start a word ("<dep"), since English stems are prefixes
PREFIX_BOOST = 3.0
#: character n-gram sizes taken from each padded word
CHARGRAM_SIZES = (3, 4, 5)
#: longer words only contribute the character n-grams of this many leading characters
MAX_CHARGRAM_WORD_CHARS = 32
#: per-embedder cache size of feature key -> (bucket indices, signed weights)
FEATURE_CACHE_SIZE = 1 << 16
#: one text of at most this many words (a query, a short note) takes `_embed_short`, not the
#: batch path; its Python loop over bigrams is still the faster of the two up to ~128 words
SHORT_TEXT_WORDS = 64
#: a small English stop-word list; a text made only of stop words keeps them
STOP_WORDS = frozenset(
    """
    a about above after again all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had
    has have having he her here hers him his how i if in into is it its itself just me more most
    my no nor not of off on once only or other our ours out over own same she should so some such
    than that the their theirs them then there these they this those through to too under until
    up very was we were what when where which while who whom why will with would you your yours
    """.split()
)

#: odd 64-bit constants for mixing two word hashes into a bigram hash (splitmix64)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN_INT, _MIX1_INT, _MIX2_INT = int(_GOLDEN), int(_MIX1), int(_MIX2)
_MASK_64 = (1 << 64) - 1
_LITTLE_U64 = np.dtype("<u8")
_TOKEN_RE = re.compile(r"[^\W_]+")

Vector = npt.NDArray[np.float32]
_Index = npt.NDArray[np.intp]
_Floats = npt.NDArray[np.float64]
_Hashes = npt.NDArray[np.uint64]
#: one word's bucket indices, signed weights and 64-bit hash (the bigram ingredient)
_WordFeatures = tuple[_Index, _Floats, int]


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 rows; `name` changes whenever the vectors would.

    A remote embedder raises EmbedderUnavailable when it cannot produce vectors through no fault
    of the texts (the batch is kept and retried) and EmbeddingRejected when the texts are refused.
    """

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Vector:
        """Return an (len(texts), dim) C-contiguous array; an empty text gives a zero row."""
        ...


class HashingEmbedder:
    """Offline, deterministic feature-hashing embedder (numpy only)."""

    def __init__(self, dim: int = 256) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.name = f"hash-v{HASHING_VERSION}-d{dim}"
        self._features = functools.lru_cache(maxsize=FEATURE_CACHE_SIZE)(
            functools.partial(_word_features, dim=dim)
        )

    def embed(self, texts: Sequence[str]) -> Vector:
        """Embed `texts` into an (n, dim) float32 array of L2-normalised (or all-zero) rows."""
        if len(texts) != 1:
            return self._embed_batch(map(_words, texts))
        words = _words(texts[0])
        if 0 < len(words) <= SHORT_TEXT_WORDS:
            return self._embed_short(words)
        return self._embed_batch([words])

    def _embed_short(self, words: list[str]) -> Vector:
        """One short text's row (a query's) in a handful of numpy calls instead of the batch
        path's many, with the batch path's bits: bincount sums each cell in the order of its
        entries, and these are the words' features, as in `_add_words`, then the cell's bigram
        total."""
        counts = Counter(words)
        features = {word: self._features(word) for word in counts}
        weights = [
            weights if tf == 1 else weights * _damp(tf)
            for (_, weights, _), tf in zip(features.values(), counts.values(), strict=True)
        ]
        bigrams = _bigram_cells([features[word][2] for word in words], self.dim)
        cells = [feature[0] for feature in features.values()]
        cells.append(np.array(list(bigrams), dtype=np.intp))
        weights.append(np.array(list(bigrams.values())))
        row = np.bincount(np.concatenate(cells), np.concatenate(weights), minlength=self.dim)
        return _normalise_row(cast(_Floats, row))  # float64 with weights, whatever the stubs say

    def _embed_batch(self, word_lists: Iterable[list[str]]) -> Vector:
        """The rows of many texts, given their words lazily: each text is tokenised just before
        its words are counted and looked up, while its strings are still in the CPU's caches."""
        unique: list[_WordFeatures] = []
        tfs: list[int] = []
        unique_per_text: list[int] = []
        hashes: list[int] = []
        words_per_text: list[int] = []
        for words in word_lists:
            counts = Counter(words)
            features = {word: self._features(word) for word in counts}
            unique.extend(features.values())
            tfs.extend(counts.values())
            unique_per_text.append(len(counts))
            hashes.extend([features[word][2] for word in words])
            words_per_text.append(len(words))
        matrix = np.zeros(len(words_per_text) * self.dim)
        if unique:
            self._add_words(matrix, unique, np.asarray(tfs), _rows(unique_per_text))
            self._add_bigrams(matrix, np.array(hashes, dtype=np.uint64), _rows(words_per_text))
        return _normalise(matrix.reshape(len(words_per_text), self.dim))

    def _add_words(
        self, matrix: _Floats, unique: list[_WordFeatures], tfs: _Index, rows: _Index
    ) -> None:
        indices = [feature[0] for feature in unique]
        sizes = np.fromiter(map(len, indices), dtype=np.intp, count=len(indices))
        cells = np.repeat(rows * self.dim, sizes) + np.concatenate(indices)
        weights = np.concatenate([feature[1] for feature in unique])
        weights *= np.repeat(1.0 + np.log(tfs), sizes)
        matrix += np.bincount(cells, weights=weights, minlength=matrix.size)

    def _add_bigrams(self, matrix: _Floats, hashes: _Hashes, rows: _Index) -> None:
        same_text = rows[1:] == rows[:-1]
        keys = _bigram_hash(hashes[:-1][same_text], hashes[1:][same_text])
        rows, keys, tfs = _count_pairs(rows[1:][same_text], keys)
        signs = np.where(keys >> np.uint64(63), 1.0, -1.0)
        cells = rows * self.dim + (keys % np.uint64(self.dim)).astype(np.intp)
        weights = BIGRAM_WEIGHT * signs * (1.0 + np.log(tfs))
        matrix += np.bincount(cells, weights=weights, minlength=matrix.size)


def _words(text: str) -> list[str]:
    """Return the lowercased words of `text` without stop words (unless that leaves none)."""
    tokens: list[str] = _TOKEN_RE.findall(text.lower())
    return [token for token in tokens if token not in STOP_WORDS] or tokens


def _rows(counts_per_text: list[int]) -> _Index:
    """Return the text (row) number of every item, given how many items each text has."""
    return np.repeat(np.arange(len(counts_per_text)), counts_per_text)


def _normalise(matrix: _Floats) -> Vector:
    # the sums np.linalg.norm(matrix, axis=1) takes, written out as `_normalise_row` does
    norms = np.sqrt(np.add.reduce(matrix * matrix, axis=1, keepdims=True))
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    return np.ascontiguousarray(matrix, dtype=np.float32)


def _normalise_row(row: _Floats) -> Vector:
    """`_normalise` of one row in fewer numpy calls: the same sum, square root and quotients."""
    norm = math.sqrt(np.add.reduce(row * row))
    return np.divide(row, norm or 1.0, out=np.empty((1, row.size), dtype=np.float32))


def _word_features(word: str, dim: int) -> _WordFeatures:
    """Map one word to the buckets and signed weights of its word and character n-gram features."""
    keys = _stable_hashes([f"w:{word}", *(f"c:{gram}" for gram in _chargrams(word))])
    indices = (keys % np.uint64(dim)).astype(np.intp)
    signs = np.where(keys >> np.uint64(63), 1.0, -1.0)
    return indices, signs * _unit_weights(min(len(word), MAX_CHARGRAM_WORD_CHARS)), int(keys[0])


@functools.lru_cache(maxsize=MAX_CHARGRAM_WORD_CHARS)
def _unit_weights(chars: int) -> _Floats:
    """The unsigned weights of a word of `chars` characters: WORD_WEIGHT, then its n-grams'.

    They depend on the length alone: a word never holds "<", so only the n-grams that start it
    start with one (and are boosted)."""
    grams = _chargrams("x" * chars)
    boosts = np.array([PREFIX_BOOST if gram[0] == "<" else 1.0 for gram in grams])
    return np.concatenate(([WORD_WEIGHT], boosts * CHARGRAM_WEIGHT / np.linalg.norm(boosts)))


def _chargrams(word: str) -> list[str]:
    padded = f"<{word[:MAX_CHARGRAM_WORD_CHARS]}>"
    return [
        padded[start : start + size]
        for size in CHARGRAM_SIZES
        for start in range(len(padded) - size + 1)
    ] or [padded]


def _stable_hashes(names: list[str]) -> _Hashes:
    """The first 8 bytes of each name's blake2b digest, as a little-endian unsigned integer."""
    digests = [
        blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest() for name in names
    ]
    return np.frombuffer(b"".join(digests), dtype=_LITTLE_U64).astype(np.uint64, copy=False)


def _bigram_hash(left: _Hashes, right: _Hashes) -> _Hashes:
    """Mix two word hashes into an order-sensitive bigram hash (splitmix64 finaliser)."""
    mixed = (left * _GOLDEN) ^ right
    mixed = (mixed ^ (mixed >> np.uint64(30))) * _MIX1
    mixed = (mixed ^ (mixed >> np.uint64(27))) * _MIX2
    return mixed ^ (mixed >> np.uint64(31))


@functools.lru_cache(maxsize=256)
def _damp(tf: int) -> float:
    """1 + log(tf), from the numpy call the batch path makes (libm's log may differ by an ulp)."""
    return float(1.0 + np.log(np.array([tf]))[0])


def _bigram_cells(hashes: list[int], dim: int) -> dict[int, float]:
    """One text's bigram weight per cell, from its words' hashes, summed as `_add_bigrams` does:
    each distinct bigram once, in the order of its hash."""
    pairs = Counter(map(_mix, hashes, hashes[1:]))
    cells: dict[int, float] = {}
    for key in sorted(pairs):
        sign = 1.0 if key >> 63 else -1.0
        cell = key % dim
        cells[cell] = cells.get(cell, 0.0) + BIGRAM_WEIGHT * sign * _damp(pairs[key])
    return cells


def _mix(left: int, right: int) -> int:
    """`_bigram_hash` of one pair, in Python ints (numpy scalars cost more than they save)."""
    mixed = (left * _GOLDEN_INT & _MASK_64) ^ right
    mixed = (mixed ^ (mixed >> 30)) * _MIX1_INT & _MASK_64
    mixed = (mixed ^ (mixed >> 27)) * _MIX2_INT & _MASK_64
    return mixed ^ (mixed >> 31)


def _count_pairs(rows: _Index, keys: _Hashes) -> tuple[_Index, _Hashes, _Index]:
    """Deduplicate (row, key) pairs; return the unique rows, keys and how often each occurred."""
    order = np.lexsort((keys, rows))
    rows, keys = rows[order], keys[order]
    starts = np.ones(len(keys), dtype=bool)
    starts[1:] = (rows[1:] != rows[:-1]) | (keys[1:] != keys[:-1])
    first = np.flatnonzero(starts)
    return rows[first], keys[first], np.diff(first, append=len(keys))
