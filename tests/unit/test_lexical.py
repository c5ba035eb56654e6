"""BM25 index: analysis, ranking on a small hand-made corpus, incremental updates, feedback."""

from __future__ import annotations

import heapq
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.index.lexical import LexicalIndex, analyze

CORPUS = {
    1: "Melanie signed up for a pottery class yesterday",
    2: "Caroline is researching adoption agencies for her family",
    3: "We went camping at the beach with the kids",
    4: "The pottery she made was a bowl with a sunflower",
    5: "Caroline moved from Sweden four years ago",
}


def build() -> LexicalIndex:
    index = LexicalIndex()
    for seq, text in CORPUS.items():
        index.add(seq, analyze(text))
    return index


def test_analyze_lowercases_drops_stop_words_and_stems():
    assert analyze("The Painted paintings, and PAINTING!") == ["paint", "paint", "paint"]
    assert analyze("Caroline's adoption agencies") == ["carolin", "adopt", "agenc"]


def test_bm25_ranks_the_note_with_the_rare_query_terms_first():
    index = build()
    ranked = [seq for seq, _ in index.search(analyze("Where did Caroline move from?"), 5)]
    assert ranked[0] == 5
    assert set(ranked) == {2, 5}  # only notes sharing a term are returned
    assert index.search(analyze("unrelated zebra"), 5) == []


def test_stemming_matches_inflections():
    index = build()
    assert index.search(analyze("camp"), 1)[0][0] == 3
    assert index.search(analyze("adopting"), 1)[0][0] == 2


def test_rarer_terms_weigh_more():
    index = build()
    assert index.idf(analyze("sweden")[0]) > index.idf(analyze("caroline")[0])


def test_add_replaces_and_remove_forgets():
    index = build()
    index.add(3, analyze("a quiet weekend at home"))
    assert index.search(analyze("camping"), 5) == []
    index.remove(5)
    index.remove(99)  # unknown seqs are ignored
    assert len(index) == 4
    assert [s for s, _ in index.search(analyze("Sweden Caroline"), 5)] == [2]
    assert index.total_len == sum(sum(counts.values()) for counts in index.docs.values())


def test_feedback_adds_terms_of_the_top_notes_but_keeps_the_query():
    index = build()
    query = index.expand(
        index.complete(analyze("pottery class")), feedback_docs=1, feedback_terms=3, weight=0.5
    )
    assert query[analyze("pottery")[0]] == 1.0
    expansion = {t: w for t, w in query.items() if w < 1.0}
    assert expansion and max(expansion.values()) == pytest.approx(0.5)
    assert set(expansion) <= {t for seq in (1, 4) for t in index.docs[seq]}
    assert index.expand(index.complete(analyze("pottery")), 5, 5, weight=0.0) == {
        analyze("pottery")[0]: 1.0
    }


def harbour_index() -> LexicalIndex:
    """The one note about a lantern says "harbour" twice and "violet" once; "harbour" is in
    five notes, "violet" in that one only."""
    index = LexicalIndex()
    index.add(0, analyze("lantern harbour harbour violet"))
    for seq in range(1, 5):
        index.add(seq, analyze(f"harbour ships number{seq}"))
    return index


def test_feedback_passes_over_a_term_in_more_notes_than_the_bound_for_a_rarer_one():
    index = harbour_index()
    harbour, violet = analyze("harbour violet")
    query = index.complete(analyze("lantern"))
    unbounded = index.expand(query, feedback_docs=1, feedback_terms=1, weight=0.4)
    assert set(unbounded) - set(query) == {harbour}  # twice the share of the rarer term
    bounded = index.expand(query, feedback_docs=1, feedback_terms=1, weight=0.4, max_notes=4)
    assert set(bounded) - set(query) == {violet}
    # the term chosen weighs what it weighs without the bound: half the commoner term's share
    both = index.expand(query, feedback_docs=1, feedback_terms=2, weight=0.4)
    assert bounded[violet] == both[violet] == pytest.approx(0.2)
    assert index.expand(query, 1, 1, 0.4, max_notes=5) == unbounded  # at the bound: kept


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    notes=st.integers(1, 300),
    feedback_terms=st.integers(1, 12),
    max_notes=st.integers(1, 300),
)
def test_bounded_feedback_keeps_the_unbounded_choice_of_rare_enough_terms(
    seed, notes, feedback_terms, max_notes
):
    """The bound only passes over terms in more than ``max_notes`` notes: the expansion holds
    no such term, every term of the unbounded expansion in at most that many notes, with the
    same weight, and as many terms as the top notes have that are rare enough."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    index = LexicalIndex()
    for seq in range(notes):
        index.add(seq, rng.choices(words, [1 / (r + 1) for r in range(40)], k=rng.randint(1, 12)))
    query = {w: 1.0 for w in rng.sample(words, 2)}
    unbounded = index.expand(query, 3, feedback_terms, 0.3)
    bounded = index.expand(query, 3, feedback_terms, 0.3, max_notes=max_notes)
    df = {t: sum(t in counts for counts in index.docs.values()) for t in words}
    added = {t: w for t, w in bounded.items() if t not in query}
    assert all(df[t] <= max_notes for t in added)
    assert {t: w for t, w in unbounded.items() if df[t] <= max_notes}.items() <= bounded.items()
    top = [seq for seq, _ in index.search_weighted(query, 3)]
    rare = {t for seq in top for t in index.docs[seq] if t not in query and df[t] <= max_notes}
    assert len(added) == min(feedback_terms, len(rare))
    if max_notes >= notes:
        assert bounded == unbounded


def test_stemming_is_safe_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor

    from worker.index.lexical import stem

    words = [f"running{i}ness" for i in range(5_000)]
    expected = [stem(w) for w in words[:10]]
    stem.cache_clear()
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(stem, words))
    assert out[:10] == expected


def test_weighted_search_matches_bm25_summed_note_by_note():
    """Many terms over many notes, with ties: the k best are exactly those a plain per-note
    BM25 sum ranks best (ties by the lower seq), however often a note repeats in the postings."""
    import math
    import random

    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(30)]
    index = LexicalIndex()
    for seq in range(400):
        index.add(seq, rng.choices(vocab[: rng.randint(3, 30)], k=rng.randint(1, 12)))
    index.add(400, [t for t, n in index.docs[7].items() for _ in range(n)])  # ties note 7
    avgdl = index.total_len / len(index)
    for _ in range(20):
        query = {t: rng.choice((1.0, 0.3, 0.05)) for t in rng.sample(vocab, rng.randint(1, 12))}
        k = rng.choice((1, 3, 10, 50))
        expected: dict[int, float] = {}
        for seq, counts in index.docs.items():
            total = 0.0
            for term, weight in query.items():
                tf = counts.get(term, 0)
                length = sum(counts.values())
                norm = tf + index.k1 * (1 - index.b + index.b * length / avgdl)
                total += index.idf(term) * weight * tf * (index.k1 + 1) / norm
            if total > 0:
                expected[seq] = total
        best = sorted(expected, key=lambda seq: (-round(expected[seq], 9), seq))[:k]
        got = index.search_weighted(query, k)
        assert [seq for seq, _ in got] == best
        assert all(math.isclose(total, expected[seq]) for seq, total in got)


def test_complete_meets_abbreviations_and_words_they_abbreviate():
    index = LexicalIndex()
    index.add(1, analyze("key-pair auth with Azure AD"))
    index.add(2, analyze("authorisation of the payments"))
    query = index.complete(analyze("authentication setup"))
    assert query["authent"] == 1.0  # the query's own terms keep weight 1
    assert 0 < query["auth"] < 1  # "auth" is a prefix of "authent"
    assert "authoris" not in query  # shares the first four characters, but neither prefixes
    assert index.search_weighted(query, 5)[0][0] == 1
    assert set(index.complete(analyze("auth"))) == {"auth"}  # indexed itself: left alone


def test_complete_leaves_known_and_short_terms_alone():
    index = LexicalIndex()
    index.add(1, analyze("the deployment pipeline"))
    assert index.complete(analyze("deploy")) == {"deploy": 1.0}  # stems alike: indexed
    assert index.complete(["dep"]) == {"dep": 1.0}  # under four characters: never completed
    assert set(index.complete(["deployments"])) == {"deployments", "deploy"}
    index.remove(1)
    assert index.complete(["deployments"]) == {"deployments": 1.0}  # forgotten with its notes


def zipf_note(rng: random.Random, vocab: int) -> list[str]:
    """One note's terms: 1 to 25 words of w0 ... w{vocab - 1} drawn by Zipf (a few terms in
    most notes), with repeats."""
    words = [f"w{i}" for i in range(vocab)]
    return rng.choices(words, [1 / (r + 1) for r in range(vocab)], k=rng.randint(1, 25))


def zipf_index(rng: random.Random, notes: int, vocab: int) -> LexicalIndex:
    """``notes`` notes of ``zipf_note``'s terms, of varied lengths."""
    index = LexicalIndex()
    for seq in range(notes):
        index.add(seq, zipf_note(rng, vocab))
    return index


def plain_search(index: LexicalIndex, query: dict[str, float], k: int) -> list[tuple[int, float]]:
    """BM25 summed note by note in Python floats, each note's weights in query order from 0, the
    k best positive totals first, ties by the lower seq: the floats the index must give, bit
    for bit (each weight is the same operations in the same order as posting.Bm25's)."""
    n, k1, b = len(index.docs), index.k1, index.b
    avgdl = max(index.total_len / max(n, 1), 1.0)
    totals: dict[int, float] = {}
    for term, weight in query.items():
        notes = sorted(seq for seq, counts in index.docs.items() if term in counts)
        scale = index.idf(term) * weight
        for seq in notes if weight > 0 else ():
            tf, length = float(index.docs[seq][term]), float(sum(index.docs[seq].values()))
            bm25 = tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avgdl))
            totals[seq] = totals.get(seq, 0.0) + bm25 * scale
    ranked = sorted((-total, seq) for seq, total in totals.items() if total > 0)
    return [(seq, -total) for total, seq in ranked[:k]]


def plain_expand(
    index: LexicalIndex, terms: dict[str, float], docs: int, n_terms: int, weight: float, bound: int
) -> dict[str, float]:
    """``LexicalIndex.expand`` as first written, over ``plain_search``."""
    query = dict(terms)
    top = plain_search(index, query, docs)
    total = sum(score for _, score in top) or 1.0
    mass: dict[str, float] = {}
    for seq, score in top:
        length = float(sum(index.docs[seq].values())) or 1.0
        for term, tf in index.docs[seq].items():
            if term not in query:
                mass[term] = mass.get(term, 0.0) + (score / total) * tf / length
    peak = max(mass.values(), default=1.0)
    if 0 < bound < len(index.docs):
        df = Counter(t for counts in index.docs.values() for t in counts)
        mass = {t: m for t, m in mass.items() if df[t] <= bound}
    for term, value in heapq.nlargest(n_terms, mass.items(), key=lambda item: item[1]):
        query[term] = weight * value / peak
    return query


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    notes=st.integers(1, 500),
    vocab=st.integers(1, 80),
    k=st.sampled_from((1, 3, 10, 50)),
    feedback=st.tuples(st.integers(1, 5), st.integers(1, 12), st.sampled_from((0.3, 1.0, 2.5))),
    bound=st.sampled_from((0, 1, 20, 8192)),
)
def test_the_channel_gives_the_plain_sum_bit_for_bit(seed, notes, vocab, k, feedback, bound):
    """complete + expand + search_weighted as a search runs them, against the plain sums: the
    same seqs in the same order with the same floats, also as notes come and go between
    searches (what the index keeps from one search to the next is dropped then)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    index = zipf_index(rng, notes, vocab)
    for _ in range(8):
        query = index.complete(rng.sample(words, rng.randint(1, min(6, vocab))))
        query.update({rng.choice(words): rng.choice((1.0, 0.3, 0.02))})
        for asked in (query, index.expand(query, *feedback, bound)):
            assert index.search_weighted(asked, k) == plain_search(index, asked, k)
        assert index.expand(query, *feedback, bound) == plain_expand(index, query, *feedback, bound)
        for _ in range(rng.randint(0, 3)):  # notes come and go
            seq = rng.randrange(notes + 5)
            index.remove(seq)
            if rng.random() < 0.7:
                index.add(seq, zipf_note(rng, vocab))
