from __future__ import annotations

import numpy as np
import pytest

from worker.organise.importance import (
    DEFAULT_PRIOR,
    Edges,
    Signals,
    edges_of,
    pagerank,
    prior_of,
    score_importance,
    select_updates,
)

DAY = 86_400.0


def dense_pagerank(matrix: np.ndarray, damping: float = 0.85) -> np.ndarray:
    """Reference: the closed form over a dense row-stochastic matrix."""
    n = len(matrix)
    out = matrix.sum(axis=1, keepdims=True)
    rows = np.where(out > 0, matrix / np.where(out > 0, out, 1), 1.0 / n)
    system = np.eye(n) - damping * rows.T
    return np.linalg.solve(system, np.full(n, (1 - damping) / n))


def test_pagerank_matches_the_dense_closed_form_on_a_weighted_graph() -> None:
    links = {
        "a": {"b": 0.9, "c": 0.2},
        "b": {"a": 0.9, "c": 0.5},
        "c": {"a": 0.2, "b": 0.5, "d": 0.3},
        "d": {"c": 0.3},
        "e": {},
    }
    ids = list(links)
    matrix = np.zeros((5, 5))
    for a, nbs in links.items():
        for b, w in nbs.items():
            matrix[ids.index(a), ids.index(b)] = w

    ranks = pagerank(edges_of(ids, links))

    assert ranks.sum() == pytest.approx(1.0)
    assert ranks == pytest.approx(dense_pagerank(matrix), abs=1e-8)


def test_the_hub_of_a_star_ranks_first_and_leaves_tie() -> None:
    links = {"hub": {f"l{i}": 0.5 for i in range(4)}} | {f"l{i}": {"hub": 0.5} for i in range(4)}
    ranks = pagerank(edges_of(list(links), links))

    assert int(np.argmax(ranks)) == 0
    assert np.ptp(ranks[1:]) == pytest.approx(0.0)


def test_pagerank_of_no_links_is_uniform_and_of_no_notes_empty() -> None:
    empty = np.zeros(0, dtype=np.int64)
    ranks = pagerank(Edges(4, empty, empty, np.zeros(0)))

    assert ranks == pytest.approx(np.full(4, 0.25))
    assert len(pagerank(Edges(0, empty, empty, np.zeros(0)))) == 0


def test_edges_of_drops_links_to_notes_outside_the_graph() -> None:
    edges = edges_of(["a", "b"], {"a": {"b": 0.4, "gone": 0.9}, "b": {"a": 0.4}})

    assert sorted(zip(edges.src.tolist(), edges.dst.tolist(), strict=True)) == [(0, 1), (1, 0)]


def signals(nid: str, **kw: float) -> Signals:
    values = {"importance": 0.5, "prior": 0.5, "access_count": 0, "last_access": 0.0}
    values.update(kw)
    return Signals(
        nid,
        values["importance"],
        values["prior"],
        int(values["access_count"]),
        values["last_access"],
        values.get("created_at", 1_000 * DAY),
    )


def test_score_rises_with_centrality_recency_retrievals_and_the_callers_hint() -> None:
    now = 1_000 * DAY
    base = signals("base", created_at=now - 60 * DAY)
    notes = [
        base,
        signals("recent", created_at=now),
        signals("retrieved", created_at=now - 60 * DAY, access_count=20),
        signals("hinted", created_at=now - 60 * DAY, prior=1.0),
        signals("central", created_at=now - 60 * DAY),
    ]
    ranks = np.array([0.1, 0.1, 0.1, 0.1, 0.6])

    scores = dict(
        zip([n.id for n in notes], score_importance(notes, ranks, now, 30 * DAY), strict=True)
    )

    assert all(0.0 <= s <= 1.0 for s in scores.values())
    for better in ("recent", "retrieved", "hinted", "central"):
        assert scores[better] > scores["base"], better


def test_a_new_hint_replaces_the_stored_prior() -> None:
    assert prior_of(0.62, auto=0.62, prior=0.9) == 0.9  # untouched since the job wrote it
    assert prior_of(0.2, auto=0.62, prior=0.9) == 0.2  # re-stored with importance=0.2
    assert prior_of(0.7, auto=None, prior=None) == 0.7  # never scored
    assert DEFAULT_PRIOR == 0.5


def test_only_notes_that_moved_are_updated() -> None:
    notes = [signals("same", importance=0.5), signals("moved", importance=0.5)]

    updates = select_updates(notes, [0.50001, 0.7])

    assert [(u.id, u.before, u.after) for u in updates] == [("moved", 0.5, 0.7)]
