"""BM25 over a namespace's notes, maintained incrementally in the worker's projection.

Terms are lowercased words minus stop words, Snowball-stemmed ("painting" and "painted" both
become "paint"). The index is rebuilt from Redis content like the FAISS index, and saved in
snapshots as each note's term counts.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

import numpy as np
import snowballstemmer

from worker.index.posting import Bm25, Floats, Floats32, Posting, PostingArrays, top
from worker.text import STOPWORDS, tokenize

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


class LexicalIndex:
    """Postings (term -> the seqs that have it, with its frequency in each), each note's term
    counts and length; add/remove by seq.

    A posting (worker/index/posting.py) keeps its entries as numpy arrays sorted by seq, and the
    notes added or removed since in compact arrays and a set, which the next search of the term
    merges in. A search reads the arrays with the BM25 weights of the last search kept beside
    them (terms no search asks for get none), and on a large index reads a very common term's
    posting only at the notes the query's other terms found. The arrays and IDF of the terms
    searched are kept at hand until a note comes or goes."""

    def __init__(self, k1: float = K1, b: float = B) -> None:
        self.k1 = k1
        self.b = b
        self.docs: dict[int, dict[str, int]] = {}
        self.total_len = 0
        self._postings: dict[str, Posting] = {}
        self._lengths: Floats32 = np.zeros(0, np.float32)  #: seq -> document length
        self._scratch: Floats = np.zeros(0)  #: seq -> a search's partial total (zeros between)
        #: the first COMPLETE_MIN_CHARS characters -> the indexed terms that start with them
        self._heads: dict[str, set[str]] = {}
        #: term -> its posting arrays and IDF, as searches read them since a note last came or went
        self._read: dict[str, tuple[PostingArrays, float]] = {}

    def __len__(self) -> int:
        return len(self.docs)

    def add(self, seq: int, terms: Iterable[str]) -> None:
        """Index a note's terms (replacing what the seq had)."""
        self.remove(seq)
        self._read.clear()
        counts = dict(Counter(terms))
        self.docs[seq] = counts
        length = sum(counts.values())
        self.total_len += length
        if seq >= len(self._lengths):
            grown = np.zeros(max(seq + 1, 2 * len(self._lengths)), np.float32)
            grown[: len(self._lengths)] = self._lengths
            self._lengths = grown
            self._scratch = np.zeros(len(grown))
        self._lengths[seq] = length
        for term, tf in counts.items():
            posting = self._postings.get(term)
            if posting is None:
                posting = self._postings[term] = Posting()
                if len(term) >= COMPLETE_MIN_CHARS:
                    self._heads.setdefault(term[:COMPLETE_MIN_CHARS], set()).add(term)
            posting.add(seq, tf)

    def remove(self, seq: int) -> None:
        counts = self.docs.pop(seq, None)
        if counts is None:
            return
        self._read.clear()
        self.total_len -= sum(counts.values())
        for term in counts:
            posting = self._postings[term]
            posting.remove(seq)
            if not posting.df:
                del self._postings[term]
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
            if term in self._postings or len(term) < COMPLETE_MIN_CHARS:
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
        posting = self._postings.get(term)
        df = (posting.df if posting else 0) or (1 if pseudo_docs else 0)
        n = len(self.docs) + pseudo_docs
        return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0

    def search(self, terms: Iterable[str], k: int) -> list[tuple[int, float]]:
        """The k best seqs by BM25 for the query terms, best first."""
        return self.search_weighted(dict.fromkeys(terms, 1.0), k)

    def search_weighted(self, query: dict[str, float], k: int) -> list[tuple[int, float]]:
        """BM25 where each query term counts with its weight; best first, ties by seq."""
        postings: list[PostingArrays] = []
        scales: list[float] = []
        for term, weight in query.items():
            if weight > 0 and term in self._postings:
                arrays, idf = self._read.get(term) or self._read_term(term)
                postings.append(arrays)
                scales.append(idf * weight)
        if not postings or k <= 0:
            return []
        bm25 = Bm25(self.k1, self.b, max(self.total_len / len(self.docs), 1.0))
        return top(postings, scales, bm25, k, self._scratch)

    def _read_term(self, term: str) -> tuple[PostingArrays, float]:
        """The term's posting arrays, brought up to date, and its IDF; kept until a note comes
        or goes."""
        read = self._read[term] = (self._postings[term].current(self._lengths), self.idf(term))
        return read

    def expand(
        self,
        terms: dict[str, float],
        feedback_docs: int,
        feedback_terms: int,
        weight: float,
        max_notes: int = 0,
    ) -> dict[str, float]:
        """Pseudo-relevance feedback (RM3-style): the weighted query terms plus the terms that
        weigh most in its first-pass top documents, weighted by their share relative to the
        term that weighs most, times ``weight``.

        With ``max_notes`` > 0, a term in more notes than that is passed over for the next
        one: its IDF is lower than any chosen term's, and its posting would cost the search
        that reads the expanded query more than ``max_notes`` entries. The terms chosen weigh
        what they would weigh without the bound."""
        query = dict(terms)
        if feedback_docs <= 0 or feedback_terms <= 0 or weight <= 0:
            return query
        mass = self._feedback_mass(query, feedback_docs)
        peak = max(mass.values(), default=1.0)
        # most first, ties in the order seen; df read only until enough terms are chosen
        by_mass: Iterable[str] = sorted(mass, key=mass.__getitem__, reverse=True)
        if 0 < max_notes < len(self.docs):
            by_mass = (t for t in by_mass if self._postings[t].df <= max_notes)
        for term in itertools.islice(by_mass, feedback_terms):
            query[term] = weight * mass[term] / peak
        return query

    def _feedback_mass(self, query: dict[str, float], feedback_docs: int) -> dict[str, float]:
        """Each term of the query's first-pass top documents that the query lacks: the sum, over
        those documents, of the document's share of their scores times the term's share of it."""
        top = self.search_weighted(query, feedback_docs)
        total = sum(score for _, score in top) or 1.0
        mass: dict[str, float] = {}
        for seq, score in top:
            share = score / total
            length = float(self._lengths[seq]) or 1.0
            for term, tf in self.docs[seq].items():
                if term not in query:
                    mass[term] = mass.get(term, 0.0) + share * tf / length
        return mass
