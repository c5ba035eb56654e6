"""Ranking policy (pure): seed 000's composite score and its parts.

score = similarity x (0.5 + importance) x (0.7 + 0.3 x recency) x connection_boost

- similarity: cosine between query and note (negative values count as 0);
- importance in [0, 1] (default 0.5), so its factor runs from 0.5 to 1.5 and never zeroes a note;
- recency = 0.5 ** (age / half-life), age since the last access (or creation);
- connection_boost = 1 + BOOST_SCALE x log1p(sum of link weights), capped at MAX_BOOST.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

BOOST_SCALE = 0.1  #: how much a well-linked note gains
MAX_BOOST = 1.5  #: the most a note's links can multiply its score by
HOP_DECAY = 0.9  #: a note reached over a link scores at most this share of its own similarity


@dataclass(frozen=True)
class Parts:
    similarity: float
    importance: float
    recency: float
    connection_boost: float

    @property
    def score(self) -> float:
        return (
            max(self.similarity, 0.0)
            * (0.5 + self.importance)
            * (0.7 + 0.3 * self.recency)
            * self.connection_boost
        )


def recency(now: float, last_access: float, created_at: float, half_life_s: float) -> float:
    """1.0 for a note touched just now, 0.5 after one half-life, towards 0 after that."""
    age = max(now - max(last_access, created_at), 0.0)
    return math.pow(0.5, age / half_life_s)


def connection_boost(links: Mapping[str, float]) -> float:
    return min(1.0 + BOOST_SCALE * math.log1p(sum(max(w, 0.0) for w in links.values())), MAX_BOOST)


def score_parts(
    similarity: float,
    importance: float,
    last_access: float,
    created_at: float,
    links: Mapping[str, float],
    *,
    now: float,
    half_life_s: float,
    hop: int = 0,
) -> Parts:
    sim = similarity * (HOP_DECAY if hop else 1.0)
    return Parts(
        similarity=sim,
        importance=min(max(importance, 0.0), 1.0),
        recency=recency(now, last_access, created_at, half_life_s),
        connection_boost=connection_boost(links),
    )
