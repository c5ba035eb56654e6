"""BM25 top-k over posting arrays: MaxScore gives exactly the exhaustive sum's k best and scores,
on random indexes, as notes come and go, through both ways of looking notes up, and the
exhaustive sum gives the same by bincount (its totals scanned or read at the entries) and in the
scratch array: those of a plain sum."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_lexical import plain_search, zipf_index, zipf_note
from worker.index import posting
from worker.index.lexical import LexicalIndex


@contextmanager
def scored_by(
    way: str,
    bisect_cost: int = posting.BISECT_COST,
    scatter_cost: int = posting.SCATTER_COST,
    gather_min: int = posting.GATHER_MIN,
    repeat_max: int = posting.REPEAT_MAX,
) -> Iterator[None]:
    """Every search by MaxScore (``way="maxscore"``) or by summing every entry (in the scratch
    array with ``scatter_cost=0``, by bincount with a huge one; its totals read back at the
    entries with ``gather_min`` far below minus ``GATHER_COST`` per entry); the weights scaled
    term by term with ``repeat_max=0``."""
    sparse = (0, 0) if way == "maxscore" else (1 << 62, 0)
    with (
        mock.patch.object(posting, "SPARSE", sparse[0]),
        mock.patch.object(posting, "SPARSE_MIN", sparse[1]),
        mock.patch.object(posting, "BISECT_COST", bisect_cost),
        mock.patch.object(posting, "SCATTER_COST", scatter_cost),
        mock.patch.object(posting, "GATHER_MIN", gather_min),
        mock.patch.object(posting, "REPEAT_MAX", repeat_max),
    ):
        yield


def random_query(rng: random.Random, vocab: int) -> dict[str, float]:
    terms = rng.sample(range(vocab), rng.randint(1, min(14, vocab)))
    return {f"w{t}": rng.choice((1.0, 1.0, 0.3, 0.1, 0.02)) for t in terms}


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    notes=st.integers(1, 600),
    vocab=st.integers(1, 60),
    k=st.sampled_from((1, 3, 10, 50)),
    bisect_cost=st.sampled_from((0, posting.BISECT_COST, 1 << 40)),
)
def test_maxscore_and_both_sums_give_the_same_top_k_exactly(seed, notes, vocab, k, bisect_cost):
    rng = random.Random(seed)
    index = zipf_index(rng, notes, vocab)
    for _ in range(rng.randint(0, notes // 10)):  # deleted and rewritten notes
        seq = rng.randrange(notes)
        index.remove(seq)
        if rng.random() < 0.5:
            index.add(seq, [f"w{rng.randrange(vocab)}" for _ in range(rng.randint(1, 9))])
    for _ in range(5):
        query = random_query(rng, vocab)
        expected = plain_search(index, query, k)
        with scored_by("every", scatter_cost=1 << 40):
            assert index.search_weighted(query, k) == expected
        with scored_by("every", scatter_cost=1 << 40, gather_min=-(1 << 40)):
            assert index.search_weighted(query, k) == expected
        with scored_by("every", scatter_cost=0, repeat_max=0):
            assert index.search_weighted(query, k) == expected
            assert not index._scratch.any()  # left all zeros
        with scored_by("maxscore", bisect_cost):
            assert index.search_weighted(query, k) == expected  # seqs, scores, order: bit for bit


def test_maxscore_reads_common_terms_only_at_the_notes_found():
    """Queries mixing rare and very common terms: some postings are never merged, yet the
    answers are those of summing every entry, also for the feedback query."""
    rng = random.Random(1)
    index = zipf_index(rng, 4_000, 400)
    merged: list[int] = []
    real_merge = posting.Found.merge

    def merge(found: posting.Found, term: posting.Term, bm25: posting.Bm25, k: int) -> None:
        merged.append(len(term.arrays.seqs))
        real_merge(found, term, bm25, k)

    skipped = 0
    for i in range(100):
        query = random_query(rng, 400)
        if i % 3 == 2:
            query.update({"w0": 1.0, "w1": 0.3})  # in most notes
        for asked, k in itertools.product((query, index.expand(query, 3, 10, 0.3)), (3, 10, 50)):
            with scored_by("every"):
                expected = index.search_weighted(asked, k)
            merged.clear()
            with scored_by("maxscore"), mock.patch.object(posting.Found, "merge", merge):
                assert index.search_weighted(asked, k) == expected
            skipped += len(merged) < len(asked)
    assert skipped > 200


@pytest.mark.parametrize("way", ["maxscore", "sum"])
def test_notes_added_and_removed_between_searches_score_as_in_a_fresh_index(way):
    """The posting arrays a search built are appended to (or rebuilt) as notes come and go:
    the scores stay exactly those of an index that never searched until the end."""
    rng = random.Random(11)
    words = [f"w{i}" for i in range(30)]
    docs = [rng.choices(words[: rng.randint(2, 30)], k=rng.randint(1, 12)) for _ in range(500)]
    queries = [{t: rng.choice((1.0, 0.3)) for t in rng.sample(words, 6)} for _ in range(8)]
    live, fresh = LexicalIndex(), LexicalIndex()
    with scored_by(way):
        for seq, terms in enumerate(docs):
            live.add(seq, terms)
            if seq % 31 == 0:
                live.search_weighted(queries[seq % len(queries)], 10)  # builds, then appends
            if seq % 47 == 46:
                live.remove(seq - 5)
                live.add(seq - 40, docs[seq])  # re-added under an older seq: rebuilt
        for seq, terms in enumerate(docs):
            fresh.add(seq, terms)
            if seq % 47 == 46:
                fresh.remove(seq - 5)
                fresh.add(seq - 40, docs[seq])
        for query in queries:
            assert live.search_weighted(query, 20) == fresh.search_weighted(query, 20)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    seqs=st.integers(1, 40),
    way=st.sampled_from(("maxscore", "sum")),
)
def test_postings_hold_exactly_their_notes_as_notes_come_go_and_come_back(seed, seqs, way):
    """Notes added, updated (re-added), removed and added again in any order between searches,
    on few seqs so that a removal often finds its entry still waiting to be merged: every
    posting brought up to date holds exactly the notes that have its term with their
    frequencies, and every search gives the plain sum."""
    rng = random.Random(seed)
    index = LexicalIndex()
    with scored_by(way):
        for _ in range(60):
            seq = rng.randrange(seqs)
            if rng.random() < 0.35:
                index.remove(seq)
            else:
                index.add(seq, zipf_note(rng, 12))
            if rng.random() < 0.2:
                query = {f"w{rng.randrange(12)}": 1.0 for _ in range(rng.randint(1, 4))}
                assert index.search_weighted(query, 5) == plain_search(index, query, 5)
    for term, kept in index._postings.items():
        arrays = kept.current(index._lengths)
        having = sorted(seq for seq, counts in index.docs.items() if term in counts)
        assert arrays.seqs.tolist() == having
        assert arrays.tfs.tolist() == [index.docs[seq][term] for seq in having]
        assert kept.df == len(having)
