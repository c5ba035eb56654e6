"""BM25 over a namespace's notes, maintained incrementally in the worker's projection.

Terms are lowercased words minus stop words, Snowball-stemmed ("painting" and "painted" both
become "paint"). The index is rebuilt from Redis content like the FAISS index, and saved in
snapshots as each note's term counts.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import Counter
from collections.abc import Collection, Iterable
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import snowballstemmer

from worker.text import STOPWORDS, tokenize

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

K1 = 1.2  #: BM25 term-frequency saturation
B = 0.3  #: BM25 length normalisation (low: memories are short, longer ones carry more)
#: Query terms no note has are completed by the terms that share their first this many
#: characters and of which one is a prefix of the other ("auth" / "authent", from
#: "authentication"); shorter terms are never completed.
#: A young namespace judges keyword rarity as if it held this many more unrelated notes, so its
#: first notes can link on a shared keyword (ingest's links, evolution's shared keywords).
RARITY_PSEUDO_DOCS = 20
COMPLETE_MIN_CHARS = 4
#: The weight of a completion, times the share of the longer term that the shorter one covers.
COMPLETE_WEIGHT = 0.5

_LOCAL = threading.local()  #: a Snowball stemmer keeps state while it works: one per thread


@lru_cache(maxsize=1 << 17)
def stem(word: str) -> str:
    stemmer = getattr(_LOCAL, "stemmer", None)
    if stemmer is None:
        stemmer = _LOCAL.stemmer = snowballstemmer.stemmer("english")
    return str(stemmer.stemWord(word))


def analyze(text: str) -> list[str]:
    """The index terms of ``text``, in order, repeats kept."""
    return terms_of(tokenize(text))


def terms_of(tokens: list[str]) -> list[str]:
    """``analyze`` of a text that ``tokenize`` already split."""
    return [stem(w) for w in tokens if w not in STOPWORDS and len(w) > 1]


def _top(
    seqs: Ints, totals: Floats, k: int, parts: list[Floats], scales: list[float]
) -> list[tuple[int, float]]:
    """The k best positive totals of ``seqs``, best first, ties broken by the lower seq
    (deterministic even at the k-th place). ``parts`` are each term's (non-negative) shares of
    the totals, one per seq of its posting, BM25 weights times the term's ``scales``: a total is
    at least any of its shares, so the k-th largest share of one term is a floor under the k-th
    best total, and only the seqs whose total reaches it can be among the k best. The floor
    comes from the term scaled most among those with k shares or more (one partition of its
    posting instead of one over every entry)."""
    wide = [i for i, part in enumerate(parts) if len(part) >= k]
    if wide:
        part = parts[max(wide, key=scales.__getitem__)]
        floor = np.partition(part, len(part) - k)[len(part) - k]
        hit = np.flatnonzero(totals >= floor)
    else:
        hit = np.unique(seqs)
    hit = hit[totals[hit] > 0]
    if len(hit) > k:
        kth = np.partition(totals[hit], len(hit) - k)[len(hit) - k]
        hit = hit[totals[hit] >= kth]
    order = hit[np.lexsort((hit, -totals[hit]))][:k]
    return [(int(s), float(totals[s])) for s in order]


class LexicalIndex:
    """Postings (term -> seq -> tf) with document lengths; add/remove by seq.

    Scoring is vectorised: each term's posting is also kept as numpy arrays (seqs, tfs,
    lengths), with its BM25 weights (before IDF) for the average document length they were last
    computed at. A term's arrays are built by the first search that needs the term (terms no
    search asks for get none: at 100k notes every term's would take 35 MB, and 0.22 s to build);
    notes added later are appended to them at the next search that needs the term, and a term
    whose posting loses a note has its arrays rebuilt then. The arrays always hold the posting in
    its dict order."""

    def __init__(self, k1: float = K1, b: float = B) -> None:
        self.k1 = k1
        self.b = b
        self.postings: dict[str, dict[int, int]] = {}
        self.docs: dict[int, dict[str, int]] = {}
        self.lengths: dict[int, int] = {}
        self.total_len = 0
        self._arrays: dict[str, tuple[Ints, Floats, Floats]] = {}
        #: term -> seqs added to its posting since its arrays were last brought up to date
        self._added: dict[str, list[int]] = {}
        self._weights: dict[str, tuple[float, Floats]] = {}  #: term -> (avgdl, BM25 weights)
        self._lengths: Floats = np.zeros(0)  #: seq -> document length, for building arrays
        #: the first COMPLETE_MIN_CHARS characters -> the indexed terms that start with them
        self._heads: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self.docs)

    def add(self, seq: int, terms: Iterable[str]) -> None:
        """Index a note's terms (replacing what the seq had)."""
        self.remove(seq)
        counts = dict(Counter(terms))
        self.docs[seq] = counts
        self.lengths[seq] = length = sum(counts.values())
        self.total_len += length
        if seq >= len(self._lengths):
            grown = np.zeros(max(seq + 1, 2 * len(self._lengths)))
            grown[: len(self._lengths)] = self._lengths
            self._lengths = grown
        self._lengths[seq] = length
        for term, tf in counts.items():
            posting = self.postings.get(term)
            if posting is None:
                posting = self.postings[term] = {}
                if len(term) >= COMPLETE_MIN_CHARS:
                    self._heads.setdefault(term[:COMPLETE_MIN_CHARS], set()).add(term)
            posting[seq] = tf
            self._weights.pop(term, None)
            arrays = self._arrays.get(term)
            if arrays is not None:
                added = self._added.setdefault(term, [])
                added.append(seq)
                if len(added) > len(arrays[0]):  # rebuilding from the posting is as cheap
                    del self._arrays[term], self._added[term]

    def remove(self, seq: int) -> None:
        counts = self.docs.pop(seq, None)
        if counts is None:
            return
        self.total_len -= self.lengths.pop(seq)
        for term in counts:
            posting = self.postings[term]
            del posting[seq]
            self._arrays.pop(term, None)
            self._added.pop(term, None)
            self._weights.pop(term, None)
            if not posting:
                del self.postings[term]
                self._forget_head(term)

    def _forget_head(self, term: str) -> None:
        head = self._heads.get(term[:COMPLETE_MIN_CHARS])
        if head is not None:
            head.discard(term)
            if not head:
                del self._heads[term[:COMPLETE_MIN_CHARS]]

    def complete(self, terms: Iterable[str]) -> dict[str, float]:
        """The query terms (weight 1) plus, for each one that no note has, the indexed terms it
        is a prefix of or that are a prefix of it, sharing at least ``COMPLETE_MIN_CHARS``
        characters: an abbreviation meets the word it abbreviates ("auth" and "authentication").
        A completion weighs ``COMPLETE_WEIGHT`` times the shorter term's share of the longer."""
        query = dict.fromkeys(terms, 1.0)
        for term in list(query):
            if term in self.postings or len(term) < COMPLETE_MIN_CHARS:
                continue
            for other in self._heads.get(term[:COMPLETE_MIN_CHARS], ()):
                short, long = sorted((term, other), key=len)
                if long.startswith(short):
                    weight = COMPLETE_WEIGHT * len(short) / len(long)
                    query[other] = max(query.get(other, 0.0), weight)
        return query

    def idf(self, term: str, pseudo_docs: int = 0) -> float:
        """BM25 IDF; ``pseudo_docs`` adds notes that lack the term (for rarity in small sets).
        A term no note has is as rare as one in a single note."""
        df = len(self.postings.get(term, ())) or (1 if pseudo_docs else 0)
        n = len(self.docs) + pseudo_docs
        return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0

    def search(self, terms: Iterable[str], k: int) -> list[tuple[int, float]]:
        """The k best seqs by BM25 for the query terms, best first."""
        return self.search_weighted(dict.fromkeys(terms, 1.0), k)

    def search_weighted(self, query: dict[str, float], k: int) -> list[tuple[int, float]]:
        """BM25 where each query term counts with its weight; best first, ties by seq."""
        terms = [(t, w) for t, w in query.items() if t in self.postings and w > 0]
        if not terms or k <= 0:
            return []
        avgdl = max(self.total_len / len(self.docs), 1.0)
        seqs: list[Ints] = []
        scores: list[Floats] = []
        scales: list[float] = []
        for term, weight in terms:
            posting, bm25 = self._term_weights(term, avgdl)
            scale = self.idf(term) * weight
            seqs.append(posting)
            scores.append(bm25 * scale)
            scales.append(scale)
        every = np.concatenate(seqs)
        # each seq's scores summed in query order (weighted bincount gives floats)
        totals = np.asarray(np.bincount(every, weights=np.concatenate(scores)), dtype=np.float64)
        return _top(every, totals, k, scores, scales)

    def _term_weights(self, term: str, avgdl: float) -> tuple[Ints, Floats]:
        """The term's posting seqs and their BM25 weights before IDF at this ``avgdl``."""
        seqs, tfs, lens = self._posting_arrays(term)
        cached = self._weights.get(term)
        if cached is None or cached[0] != avgdl:
            k1, b = self.k1, self.b
            bm25 = tfs * (k1 + 1) / (tfs + k1 * (1 - b + b * lens / avgdl))
            cached = self._weights[term] = (avgdl, bm25)
        return seqs, cached[1]

    def _posting_arrays(self, term: str) -> tuple[Ints, Floats, Floats]:
        posting = self.postings[term]
        arrays = self._arrays.get(term)
        if arrays is None:
            arrays = self._arrays[term] = self._arrays_of(posting.keys(), posting.values())
        added = self._added.pop(term, None)
        if added:
            more = self._arrays_of(added, map(posting.__getitem__, added))
            arrays = self._arrays[term] = (
                np.concatenate((arrays[0], more[0])),
                np.concatenate((arrays[1], more[1])),
                np.concatenate((arrays[2], more[2])),
            )
        return arrays

    def _arrays_of(self, seqs: Collection[int], tfs: Iterable[int]) -> tuple[Ints, Floats, Floats]:
        """The (seqs, tfs, lengths) arrays of these seqs and their term frequencies."""
        at = np.fromiter(seqs, dtype=np.int64, count=len(seqs))
        counts = np.fromiter(tfs, dtype=np.float64, count=len(seqs))
        return at, counts, self._lengths[at]

    def expand(
        self, terms: dict[str, float], feedback_docs: int, feedback_terms: int, weight: float
    ) -> dict[str, float]:
        """Pseudo-relevance feedback (RM3-style): the weighted query terms plus the terms that
        weigh most in its first-pass top documents, weighted by their share, times ``weight``."""
        query = dict(terms)
        if feedback_docs <= 0 or feedback_terms <= 0 or weight <= 0:
            return query
        top = self.search_weighted(query, feedback_docs)
        total = sum(score for _, score in top) or 1.0
        mass: dict[str, float] = {}
        for seq, score in top:
            length = self.lengths[seq] or 1
            for term, tf in self.docs[seq].items():
                if term not in query:
                    mass[term] = mass.get(term, 0.0) + (score / total) * tf / length
        best = heapq.nlargest(feedback_terms, mass.items(), key=lambda item: item[1])
        peak = best[0][1] if best else 1.0
        for term, value in best:
            query[term] = weight * value / peak
        return query
