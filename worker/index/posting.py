"""BM25 postings held as seq-sorted arrays (``Posting``, brought up to date by the searches that
read them), and the exact top-k over them. A query whose postings are short next to the index
(``SPARSE``) is scored by term-at-a-time MaxScore, which reads its longest postings only at the
notes its other terms found; any other query sums every entry.

MaxScore: a term's weight in any note is at most its ``bound`` (its largest term frequency in its
shortest note, times its scale). Whole postings are merged into partial totals, shortest first;
the best k-th best partial total among the notes of one merged term is a lower bound (``floor``)
of the k-th best total. Once the terms left can be split so that those with the longest postings
have bounds summing under the floor, those are only looked up: a note that none of the merged
terms has totals under the floor and cannot be among the k best. The notes found are pruned by
the floor as lookups raise it, and the few left are summed again in query order, as the
exhaustive sum gives them: the k best and their scores are exactly that sum's, ties broken by
the lower seq (``MARGIN`` covers the rounding of sums taken in another order).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Floats32 = npt.NDArray[np.float32]

#: A query is scored by MaxScore when the index holds more than ``SPARSE_MIN`` notes plus this
#: many per entry of its postings; otherwise every entry is summed in a few vectorised
#: operations, which then cost less than MaxScore's many small ones (measured in
#: bench/lexical.py: at 1M notes, summing in the scratch array beat MaxScore at the median for
#: queries of every size measured, so MaxScore is kept for indexes far larger than a query).
SPARSE = 64
SPARSE_MIN = 131_072
#: Looking a note up in a posting by bisection costs about this many times one write of one of
#: the posting's entries to an array indexed by seq: lookups of more notes than the posting's
#: length over this write the posting there and read the notes back.
BISECT_COST = 8
#: The exhaustive sum adds each entry into ``scratch``, reads it back and zeroes it (three
#: scattered passes over the entries) when the index holds more than ``SPARSE_MIN`` notes and
#: more than this many per entry of the query's postings; otherwise it sums them with one
#: bincount over an array of one float per note, whose allocation and scan cost about this many
#: entries' scattered passes per note, and less on a smaller index, whose array stays in cache
#: (measured in bench/lexical.py).
SCATTER_COST = 10
#: Summed by bincount, the totals are read back at the query's entries (the seqs that reach the
#: floor then found among them by a sort) when its array holds more than ``GATHER_MIN`` plus
#: this many floats per entry; otherwise the seqs are found by scanning that array, which costs
#: about a quarter of a nanosecond per note (measured at 10k-100k notes: 4% less at 100k).
GATHER_COST = 12
GATHER_MIN = 22_000
#: Comparisons with the floor allow this relative slack, far more than the rounding of summing a
#: note's weights in another order can make.
MARGIN = 1e-9
#: Up to this many entries are scaled in one multiply by their terms' scales repeated, which
#: then costs less than a multiply per term; more are scaled term by term, which saves
#: allocating and filling two more arrays of their length (measured: at 64,000 entries the
#: repeat cost 16 times as much, at 200 a third as much).
REPEAT_MAX = 8192
#: Up to this many totals are ranked by one sort; more are first cut at the k-th best by a
#: partition, which then costs less than sorting them all (measured: about 800).
SORT_MAX = 512
#: The least positive float: a total counts when it reaches it.
LEAST = math.ulp(0.0)


class Bm25(NamedTuple):
    """The BM25 parameters and the average document length of one search."""

    k1: float
    b: float
    avgdl: float

    def weights(self, tf: Floats32, lens: Floats32) -> Floats:
        """BM25 weights (before IDF) of term frequencies ``tf`` in documents of ``lens``."""
        k1, b = self.k1, self.b
        tf64, lens64 = tf.astype(np.float64), lens.astype(np.float64)
        return np.asarray(tf64 * (k1 + 1) / (tf64 + k1 * (1 - b + b * lens64 / self.avgdl)))


class Posting:
    """One term's posting: the notes that have it and its frequency in each, as ``PostingArrays``
    that a search reads, and the changes since they were last brought up to date (entries added,
    in compact arrays, and seqs removed), which the next search of the term brings in."""

    def __init__(self) -> None:
        self.df = 0  #: notes that have the term
        self.arrays: PostingArrays | None = None
        #: the entries added since the arrays were last brought up to date, in ascending seqs,
        #: and those whose seq came below the last of them (a note updated), in any order
        self.added_seqs, self.added_tfs = array("q"), array("f")
        self.readded_seqs, self.readded_tfs = array("q"), array("f")
        self.removed: set[int] = set()  #: seqs of ``arrays`` no longer in the posting

    def add(self, seq: int, tf: int) -> None:
        """A note that has the term (not in the posting)."""
        if self.added_seqs and seq < self.added_seqs[-1]:
            self.readded_seqs.append(seq)
            self.readded_tfs.append(tf)
        else:
            self.added_seqs.append(seq)
            self.added_tfs.append(tf)
        self.df += 1

    def remove(self, seq: int) -> None:
        """A note of the posting that has the term no more: an entry added since the arrays were
        brought up to date is dropped (found by bisection among the ascending ones), one of the
        arrays is marked. A seq is added only when it is not in the posting, so it is in one
        place; it may also be marked in the arrays from an earlier life, a mark that stays."""
        seqs = self.added_seqs
        at = bisect.bisect_left(seqs, seq)
        if at < len(seqs) and seqs[at] == seq:
            del seqs[at]
            del self.added_tfs[at]
        elif self.readded_seqs and (found := _index(self.readded_seqs, seq)) is not None:
            del self.readded_seqs[found]
            del self.readded_tfs[found]
        else:
            self.removed.add(seq)
        self.df -= 1

    def current(self, lengths: Floats32) -> PostingArrays:
        """The arrays, brought up to date (``lengths``: seq -> document length)."""
        arrays = self.arrays
        if arrays is not None and self.removed:
            gone = np.fromiter(self.removed, np.int64, len(self.removed))
            kept = np.flatnonzero(~np.isin(arrays.seqs, gone))
            arrays = PostingArrays(arrays.seqs[kept], arrays.tfs[kept], arrays.lens[kept])
            self.removed.clear()
        if arrays is None or self.added_seqs or self.readded_seqs:
            seqs = np.frombuffer(self.added_seqs + self.readded_seqs, np.int64)
            tfs = np.frombuffer(self.added_tfs + self.readded_tfs, np.float32)
            added = PostingArrays.of(seqs, tfs, lengths[seqs])
            arrays = added if arrays is None else arrays.extend(added)
            self.added_seqs, self.added_tfs = array("q"), array("f")
            self.readded_seqs, self.readded_tfs = array("q"), array("f")
        self.arrays = arrays
        return arrays


def _index(seqs: array[int], seq: int) -> int | None:
    """Where ``seq`` is in ``seqs`` (in any order), if it is there."""
    found = np.flatnonzero(np.frombuffer(seqs, np.int64) == seq)
    return int(found[0]) if len(found) else None


class PostingArrays:
    """A term's posting as arrays sorted by seq: seqs, term frequencies, document lengths."""

    def __init__(self, seqs: Ints, tfs: Floats32, lens: Floats32) -> None:
        self.seqs, self.tfs, self.lens = seqs, tfs, lens
        self.most_tf = float(tfs.max()) if len(tfs) else 0.0
        self.least_len = float(lens.min()) if len(lens) else 0.0
        #: the BM25 weights of the last search, and its average document length
        self._weights: tuple[float, Floats] = (0.0, np.zeros(0))

    def weights(self, bm25: Bm25) -> Floats:
        """The BM25 weights (before IDF) of every entry (the index's ``k1`` and ``b`` do not
        change: its average document length does)."""
        if self._weights[0] != bm25.avgdl:
            self._weights = (bm25.avgdl, bm25.weights(self.tfs, self.lens))
        return self._weights[1]

    @classmethod
    def of(cls, seqs: Ints, tfs: Floats32, lens: Floats32) -> PostingArrays:
        """The arrays of these entries, in any order."""
        if np.any(seqs[1:] < seqs[:-1]):
            order = np.argsort(seqs, kind="stable")
            seqs, tfs, lens = seqs[order], tfs[order], lens[order]
        return cls(seqs, tfs, lens)

    def extend(self, more: PostingArrays) -> PostingArrays:
        """These arrays with more entries (seqs they do not hold)."""
        return PostingArrays.of(
            np.concatenate((self.seqs, more.seqs)),
            np.concatenate((self.tfs, more.tfs)),
            np.concatenate((self.lens, more.lens)),
        )

    def bound(self, bm25: Bm25) -> float:
        """At least the largest BM25 weight (before IDF) of the term in any of its notes."""
        k1, b, tf = bm25.k1, bm25.b, self.most_tf
        return tf * (k1 + 1) / (tf + k1 * (1 - b + b * self.least_len / bm25.avgdl))

    def at(self, seqs: Ints, scratch: Floats) -> tuple[Ints, Ints]:
        """Where ``seqs`` are in these arrays: (index into ``seqs``, index here). Many seqs are
        looked up through ``scratch`` (all zeros, left so), a few by bisection."""
        if len(seqs) * BISECT_COST < len(self.seqs):
            at = np.searchsorted(self.seqs, seqs)
            hit = np.flatnonzero(self.seqs.take(at, mode="clip") == seqs)
            return hit, at[hit]
        scratch[self.seqs] = np.arange(1, len(self.seqs) + 1)
        found = scratch[seqs]
        scratch[self.seqs] = 0
        hit = np.flatnonzero(found)
        return hit, found[hit].astype(np.int64) - 1


class Term(NamedTuple):
    """A query term: its posting arrays and its scale (IDF times query weight, > 0)."""

    arrays: PostingArrays
    scale: float

    def weights_at(self, seqs: Ints, scratch: Floats, bm25: Bm25) -> tuple[Ints, Floats]:
        """The term's weights (times its scale) at those of ``seqs`` it has: (index, weight)."""
        mine, theirs = self.arrays.at(seqs, scratch)
        return mine, self.arrays.weights(bm25)[theirs] * self.scale


class Found:
    """The notes a search found and their partial totals: summed in ``scratch`` (indexed by
    seq, all zeros outside a search) while whole postings are merged, then read out."""

    def __init__(self, scratch: Floats) -> None:
        self.scratch = scratch
        self.parts: list[Ints] = []  #: the seqs that each merge found first
        #: the best k-th best partial total among the notes of one merged term
        self.floor = 0.0
        self.seqs = np.zeros(0, np.int64)
        self.totals = np.zeros(0)

    def merge(self, term: Term, bm25: Bm25, k: int) -> None:
        """Every entry of the term added in: the notes it has that were not found yet join."""
        a = term.arrays
        before = self.scratch[a.seqs]
        self.parts.append(a.seqs[before == 0])
        after = before + a.weights(bm25) * term.scale
        self.scratch[a.seqs] = after
        if len(after) >= k:
            self.floor = max(self.floor, float(np.partition(after, len(after) - k)[-k]))

    def settle(self) -> None:
        """Read the totals out of the scratch array and zero it: no more merges."""
        self.seqs = np.concatenate(self.parts) if self.parts else self.seqs
        self.totals = self.scratch[self.seqs]
        self.scratch[self.seqs] = 0

    def add(self, term: Term, bm25: Bm25) -> None:
        """The term's weights added to the notes found (settled), which it is not merged into."""
        mine, weights = term.weights_at(self.seqs, self.scratch, bm25)
        self.totals[mine] += weights

    def keep(self, k: int, unread: float) -> None:
        """Drop the notes whose totals cannot reach the k-th best with ``unread`` more."""
        if len(self.totals) >= k:
            self.floor = max(self.floor, float(np.partition(self.totals, -k)[-k]))
        kept = np.flatnonzero(self.totals >= self.floor * (1 - MARGIN) - unread)
        self.seqs, self.totals = self.seqs[kept], self.totals[kept]


def top(
    postings: list[PostingArrays], scales: list[float], bm25: Bm25, k: int, scratch: Floats
) -> list[tuple[int, float]]:
    """The k best seqs by the BM25 sum over the query terms (their postings, and their scales:
    IDF times query weight, > 0), best first, ties by the lower seq; exactly the k best of
    summing every entry of every posting, in query order. ``scratch`` is all zeros, longer than
    the largest seq, and left so."""
    if len(scratch) < SPARSE * sum(len(a.seqs) for a in postings) + SPARSE_MIN:
        return _every(postings, scales, bm25, k, scratch)
    terms = [Term(a, scale) for a, scale in zip(postings, scales, strict=True)]
    found = Found(scratch)
    bounds = [t.arrays.bound(bm25) * t.scale for t in terms]
    lookups = _merge_rarest(found, terms, bounds, bm25, k)
    unread = sum(bounds[i] for i in lookups)
    for i in sorted(lookups, key=bounds.__getitem__, reverse=True):
        found.keep(k, unread)
        found.add(terms[i], bm25)
        unread -= bounds[i]
    found.keep(k, 0.0)
    found.totals = np.zeros(len(found.seqs))
    for term in terms:  # summed again in query order
        found.add(term, bm25)
    return _best(found.seqs, found.totals, k)


def _best(seqs: Ints, totals: Floats, k: int) -> list[tuple[int, float]]:
    """The k best of ``seqs`` (in any order) with positive ``totals``, best first, ties by the
    lower seq."""
    positive = totals > 0
    seqs, totals = seqs[positive], totals[positive]
    by_seq = seqs.argsort()
    return _ranked(seqs[by_seq], totals[by_seq], k)


def _every(
    postings: list[PostingArrays], scales: list[float], bm25: Bm25, k: int, scratch: Floats
) -> list[tuple[int, float]]:
    """``top`` by summing every entry: the k best positive totals, ties by the lower seq. Each
    seq's weights are summed in query order from 0, by bincount or in ``scratch``; only the
    seqs whose total reaches ``_floor`` are ranked."""
    lengths = [len(a.seqs) for a in postings]
    every = np.concatenate([a.seqs for a in postings])
    weights = _scaled(postings, scales, lengths, bm25)
    floor = _floor(weights, lengths, scales, k)
    if len(scratch) > SPARSE_MIN and len(every) * SCATTER_COST < len(scratch):
        seqs, totals = _sum_scattered(every, weights, floor, scratch)
    else:
        by_seq = np.asarray(np.bincount(every, weights=weights), np.float64)  # floats: weighted
        if len(every) * GATHER_COST + GATHER_MIN < len(by_seq):
            seqs, totals = _reaching(every, by_seq[every], floor)
        else:
            seqs = (by_seq >= floor).nonzero()[0]
            totals = by_seq[seqs]
    return _ranked(seqs, totals, k)


def _scaled(
    postings: list[PostingArrays], scales: list[float], lengths: list[int], bm25: Bm25
) -> Floats:
    """Every entry's weight times its term's scale, in query order: up to ``REPEAT_MAX`` entries
    in one multiply by the scales repeated, more term by term into one array."""
    entries = sum(lengths)
    if entries <= REPEAT_MAX:
        weights = np.concatenate([a.weights(bm25) for a in postings])
        weights *= np.array(scales).repeat(lengths)
        return weights
    weights = np.empty(entries)
    end = 0
    for a, scale, n in zip(postings, scales, lengths, strict=True):
        np.multiply(a.weights(bm25), scale, out=weights[end : end + n])
        end += n
    return weights


def _floor(weights: Floats, lengths: list[int], scales: list[float], k: int) -> float:
    """At most the k-th best total, and positive: a total is at least any of its shares, so the
    k-th largest share of one term (the one scaled most among those with k entries or more) is
    under the k-th best total. With no such term, the least positive float."""
    wide = [i for i, n in enumerate(lengths) if n >= k]
    if not wide:
        return LEAST
    i = max(wide, key=scales.__getitem__)
    end = sum(lengths[: i + 1])
    return max(float(np.partition(weights[end - lengths[i] : end], -k)[-k]), LEAST)


def _ranked(seqs: Ints, totals: Floats, k: int) -> list[tuple[int, float]]:
    """The k best of ``seqs`` (ascending) by their ``totals``, best first, ties by the lower
    seq (a stable sort keeps the lower first)."""
    if len(totals) > max(k, SORT_MAX):
        kept = np.flatnonzero(totals >= np.partition(totals, -k)[-k])
        seqs, totals = seqs[kept], totals[kept]
    order = (-totals).argsort(kind="stable")[:k]
    return list(zip(seqs[order].tolist(), totals[order].tolist(), strict=True))


def _sum_scattered(
    every: Ints, weights: Floats, floor: float, scratch: Floats
) -> tuple[Ints, Floats]:
    """The seqs of ``every`` whose weights sum to ``floor`` or more, and those sums: each seq's
    weights added in ``scratch`` in query order (from 0, as bincount adds them), read back at
    the entries and zeroed there."""
    np.add.at(scratch, every, weights)
    try:
        totals = scratch[every]  # a seq's total at each of its entries
    finally:
        scratch[every] = 0
    return _reaching(every, totals, floor)


def _reaching(every: Ints, totals: Floats, floor: float) -> tuple[Ints, Floats]:
    """The seqs of ``every`` whose total (given at each of their entries) reaches ``floor``,
    ascending, and those totals."""
    hit = np.flatnonzero(totals >= floor)
    seqs, first = np.unique(every[hit], return_index=True)
    return seqs, totals[hit][first]


def _merge_rarest(
    found: Found, terms: Sequence[Term], bounds: list[float], bm25: Bm25, k: int
) -> list[int]:
    """Merge whole postings into ``found``, shortest first, until the longest of those left
    have bounds summing under the floor; settle ``found`` and return those left."""
    rest = sorted(range(len(terms)), key=lambda i: len(terms[i].arrays.seqs))
    lookups: list[int] = []
    try:
        while len(lookups) < len(rest):
            rest.remove(i := next(i for i in rest if i not in lookups))
            found.merge(terms[i], bm25, k)
            lookups = _lookups(rest, bounds, found.floor)
    finally:
        found.settle()
    return lookups


def _lookups(rest: list[int], bounds: list[float], floor: float) -> list[int]:
    """The terms of ``rest`` (shortest posting first) to look up only: from the longest, each
    whose bound still fits, bounds summing under the floor (less the margin)."""
    chosen: list[int] = []
    room = floor * (1 - MARGIN)
    for i in reversed(rest):
        if bounds[i] < room:
            chosen.append(i)
            room -= bounds[i]
    return chosen
