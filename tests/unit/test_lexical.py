"""BM25 index: analysis, ranking on a small hand-made corpus, incremental updates, feedback."""

from __future__ import annotations

import pytest

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
