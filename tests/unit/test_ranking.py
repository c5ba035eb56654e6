from __future__ import annotations

import math

import pytest

from worker.organise.decay import recency
from worker.search.ranking import (
    BOOST_SCALE,
    MAX_BOOST,
    Parts,
    backfill,
    boost_of,
    fuse,
    link_total,
    score_parts,
    spread,
)

DAY = 86_400.0
NOW = 1_700_000_000.0


def test_recency_is_one_at_age_zero() -> None:
    assert recency(NOW, 0.0, NOW, DAY) == 1.0


def test_recency_halves_every_half_life() -> None:
    assert recency(NOW + DAY, 0.0, NOW, DAY) == pytest.approx(0.5)
    assert recency(NOW + 3 * DAY, 0.0, NOW, DAY) == pytest.approx(0.125)


def test_recency_counts_from_the_last_access_when_it_is_later() -> None:
    assert recency(NOW + DAY, NOW + DAY, NOW - 10 * DAY, DAY) == 1.0
    assert recency(NOW + 2 * DAY, NOW + DAY, NOW - 10 * DAY, DAY) == pytest.approx(0.5)


def test_recency_of_a_note_from_the_future_is_one() -> None:
    assert recency(NOW, 0.0, NOW + 60, DAY) == 1.0


def test_recency_falls_towards_zero() -> None:
    assert 0 < recency(NOW + 100 * DAY, 0.0, NOW, DAY) < 1e-29


def test_connection_boost_is_one_without_links() -> None:
    assert boost_of(link_total({})) == 1.0


def test_connection_boost_grows_with_link_weight() -> None:
    one = boost_of(link_total({"a": 0.5}))
    two = boost_of(link_total({"a": 0.5, "b": 0.5}))

    assert 1.0 < one < two
    assert two == pytest.approx(1 + BOOST_SCALE * math.log1p(1.0))


def test_connection_boost_ignores_negative_weights() -> None:
    assert boost_of(link_total({"a": -5.0})) == 1.0
    assert boost_of(link_total({"a": 0.5, "b": -5.0})) == boost_of(link_total({"a": 0.5}))


def test_connection_boost_is_capped() -> None:
    assert boost_of(link_total({f"n{i}": 1.0 for i in range(10_000)})) == MAX_BOOST


def test_the_score_is_the_documented_product() -> None:
    parts = Parts(relevance=0.8, importance=0.6, recency=0.5, connection_boost=1.2)

    assert parts.score == pytest.approx(0.8 * (0.5 + 0.6) * (0.7 + 0.3 * 0.5) * 1.2)


def test_importance_zero_never_zeroes_a_score() -> None:
    assert Parts(0.5, 0.0, 0.0, 1.0).score == pytest.approx(0.5 * 0.5 * 0.7)


@pytest.mark.parametrize("relevance", [-0.3, -1.0, 0.0])
def test_a_negative_or_zero_relevance_scores_zero(relevance: float) -> None:
    assert Parts(relevance, 1.0, 1.0, MAX_BOOST).score == 0.0


def test_score_parts_fills_every_part() -> None:
    parts = score_parts(0.7, 0.4, 0.0, NOW - DAY, 1.0, now=NOW, half_life_s=DAY)

    assert parts == Parts(
        relevance=0.7,
        importance=0.4,
        recency=pytest.approx(0.5),
        connection_boost=pytest.approx(1 + BOOST_SCALE * math.log1p(1.0)),
    )


@pytest.mark.parametrize(("importance", "clamped"), [(-1.0, 0.0), (2.0, 1.0), (0.3, 0.3)])
def test_score_parts_clamps_importance_to_zero_one(importance: float, clamped: float) -> None:
    parts = score_parts(0.5, importance, 0.0, NOW, 0.0, now=NOW, half_life_s=DAY)

    assert parts.importance == clamped


def test_fuse_puts_first_everywhere_at_one_and_weights_channels() -> None:
    fused = fuse({"dense": ["a", "b"], "lexical": ["a", "c"]}, {"dense": 1, "lexical": 1}, 60)
    assert fused["a"] == pytest.approx(1.0)
    assert fused["b"] == pytest.approx(fused["c"]) and fused["b"] < fused["a"]
    lexical_only = fuse({"dense": ["b"], "lexical": ["c"]}, {"dense": 0, "lexical": 1}, 60)
    assert lexical_only == {"c": pytest.approx(1.0)}
    assert fuse({"dense": ["a"]}, {"dense": 0}, 60) == {}


def test_spread_flows_relevance_along_weighted_links() -> None:
    links = {"a": {"b": 0.5, "c": 1.0}, "d": {"b": 0.5}}
    flow = spread({"a": 1.0, "d": 0.4}, links, graph_weight=0.5)
    assert flow == {"b": pytest.approx(0.25), "c": pytest.approx(0.5)}
    assert spread({"a": 1.0}, links, graph_weight=0.0) == {}


def test_backfill_appends_dense_notes_below_the_fused_ones_up_to_k() -> None:
    fused = {"a": 1.0, "b": 0.4}
    out = backfill(fused, {"a": 0.9, "c": 0.8, "d": 0.6, "e": -0.1}, k=3)
    assert out == {"a": 1.0, "b": 0.4, "c": pytest.approx(0.5 * 0.4 * 0.8)}
    assert backfill(fused, {"c": 0.8}, k=2) == fused
    assert backfill({}, {"c": 0.8, "d": -0.2}, k=5) == {"c": pytest.approx(0.4)}
