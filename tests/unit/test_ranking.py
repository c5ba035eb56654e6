from __future__ import annotations

import math

import pytest

from worker.ranking import (
    BOOST_SCALE,
    HOP_DECAY,
    MAX_BOOST,
    Parts,
    connection_boost,
    recency,
    score_parts,
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
    assert connection_boost({}) == 1.0


def test_connection_boost_grows_with_link_weight() -> None:
    one = connection_boost({"a": 0.5})
    two = connection_boost({"a": 0.5, "b": 0.5})

    assert 1.0 < one < two
    assert two == pytest.approx(1 + BOOST_SCALE * math.log1p(1.0))


def test_connection_boost_ignores_negative_weights() -> None:
    assert connection_boost({"a": -5.0}) == 1.0
    assert connection_boost({"a": 0.5, "b": -5.0}) == connection_boost({"a": 0.5})


def test_connection_boost_is_capped() -> None:
    assert connection_boost({f"n{i}": 1.0 for i in range(10_000)}) == MAX_BOOST


def test_the_score_is_the_documented_product() -> None:
    parts = Parts(similarity=0.8, importance=0.6, recency=0.5, connection_boost=1.2)

    assert parts.score == pytest.approx(0.8 * (0.5 + 0.6) * (0.7 + 0.3 * 0.5) * 1.2)


def test_importance_zero_never_zeroes_a_score() -> None:
    assert Parts(0.5, 0.0, 0.0, 1.0).score == pytest.approx(0.5 * 0.5 * 0.7)


@pytest.mark.parametrize("similarity", [-0.3, -1.0, 0.0])
def test_a_negative_or_zero_similarity_scores_zero(similarity: float) -> None:
    assert Parts(similarity, 1.0, 1.0, MAX_BOOST).score == 0.0


def test_score_parts_fills_every_part() -> None:
    parts = score_parts(0.7, 0.4, 0.0, NOW - DAY, {"a": 1.0}, now=NOW, half_life_s=DAY)

    assert parts == Parts(
        similarity=0.7,
        importance=0.4,
        recency=pytest.approx(0.5),
        connection_boost=pytest.approx(1 + BOOST_SCALE * math.log1p(1.0)),
    )


@pytest.mark.parametrize(("importance", "clamped"), [(-1.0, 0.0), (2.0, 1.0), (0.3, 0.3)])
def test_score_parts_clamps_importance_to_zero_one(importance: float, clamped: float) -> None:
    parts = score_parts(0.5, importance, 0.0, NOW, {}, now=NOW, half_life_s=DAY)

    assert parts.importance == clamped


@pytest.mark.parametrize("hop", [1, 2, 3])
def test_a_note_reached_over_links_has_its_similarity_decayed(hop: int) -> None:
    direct = score_parts(0.8, 0.5, 0.0, NOW, {}, now=NOW, half_life_s=DAY)
    reached = score_parts(0.8, 0.5, 0.0, NOW, {}, now=NOW, half_life_s=DAY, hop=hop)

    assert reached.similarity == pytest.approx(0.8 * HOP_DECAY)
    assert reached.score == pytest.approx(direct.score * HOP_DECAY)
