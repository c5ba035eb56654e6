"""Ranking policy (pure): channel fusion, graph spreading and zettelkasten-memory's composite score.

relevance  = weighted reciprocal-rank fusion of the dense (FAISS) and lexical (BM25) rankings,
             normalised so that first place in every enabled channel is 1.0; notes reached over
             links add spread = relevance of the linking note x link weight x graph weight.
score      = relevance x (0.5 + importance) x (0.7 + 0.3 x recency) x connection_boost

- importance in [0, 1] (default 0.5), so its factor runs from 0.5 to 1.5 and never zeroes a note;
- recency = 0.5 ** (age / half-life), age since the last access (or creation);
- connection_boost = 1 + BOOST_SCALE x log1p(sum of link weights), capped at MAX_BOOST.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from worker.organise.decay import recency

BOOST_SCALE = 0.1  #: how much a well-linked note gains
MAX_BOOST = 1.5  #: the most a note's links can multiply its score by
BACKFILL_SHARE = 0.5  #: a backfilled note's relevance: at most this share of the weakest fused one


class Parts(NamedTuple):  # a tuple: built for every candidate of every search
    relevance: float
    importance: float
    recency: float
    connection_boost: float

    @property
    def score(self) -> float:
        return (
            max(self.relevance, 0.0)
            * (0.5 + self.importance)
            * (0.7 + 0.3 * self.recency)
            * self.connection_boost
        )


def fuse(
    rankings: Mapping[str, Sequence[str]], weights: Mapping[str, float], rrf_k: int
) -> dict[str, float]:
    """Weighted reciprocal-rank fusion; 1.0 means first in every channel with weight > 0."""
    active = {name: w for name, w in weights.items() if w > 0 and name in rankings}
    if not active:
        return {}
    norm = sum(active.values()) / (rrf_k + 1)
    fused: dict[str, float] = {}
    for name, weight in active.items():
        for rank, nid in enumerate(rankings[name]):
            fused[nid] = fused.get(nid, 0.0) + weight / (rrf_k + rank + 1)
    return {nid: value / norm for nid, value in fused.items()}


def fuse_scores(
    scores: Mapping[str, Mapping[str, float]], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted sum of each channel's scores divided by that channel's best score; 1.0 means
    best in every channel with weight > 0. Negative scores count as 0."""
    active = {name: w for name, w in weights.items() if w > 0 and scores.get(name)}
    total = sum(active.values())
    fused: dict[str, float] = {}
    for name, weight in active.items():
        peak = max(scores[name].values())
        if peak <= 0:
            continue
        for nid, value in scores[name].items():
            fused[nid] = fused.get(nid, 0.0) + weight * max(value, 0.0) / peak / total
    return fused


def backfill(
    relevance: Mapping[str, float], dense: Mapping[str, float], k: int
) -> dict[str, float]:
    """Up to k notes: when fusion found fewer, the dense channel's best (positive cosine) are
    appended below every fused note, so a paraphrase with no shared word still finds something
    while the fused order is never changed."""
    out = dict(relevance)
    floor = BACKFILL_SHARE * min(out.values(), default=1.0)
    for nid, cosine in sorted(dense.items(), key=lambda item: -item[1]):
        if len(out) >= k or cosine <= 0:
            break
        out.setdefault(nid, floor * cosine)
    return out


def spread(
    seeds: Mapping[str, float], links: Mapping[str, Mapping[str, float]], graph_weight: float
) -> dict[str, float]:
    """Relevance that flows from seed notes to their neighbours along weighted links: the
    strongest single flow, so a hub linked to many seeds gains no more than from its best one."""
    flow: dict[str, float] = {}
    if graph_weight <= 0:
        return flow
    for seed, relevance in seeds.items():
        for nb, weight in links.get(seed, {}).items():
            value = relevance * max(weight, 0.0) * graph_weight
            best = flow.get(nb, 0.0)
            flow[nb] = value if value > best else best  # max(best, value), without the call
    return flow


def mmr(
    scores: npt.NDArray[np.float32], vecs: npt.NDArray[np.float32], k: int, balance: float
) -> list[int]:
    """Maximal marginal relevance: greedily pick the candidate maximising
    balance x score - (1 - balance) x (its highest cosine to a pick so far).
    Scores are first scaled to [0, 1] so the two terms are comparable."""
    if len(scores) == 0:
        return []
    top = float(np.max(scores)) or 1.0
    rel = scores / top
    chosen: list[int] = []
    closest = np.full(len(scores), -np.inf, dtype=np.float32)
    left = np.ones(len(scores), dtype=bool)
    for _ in range(min(k, len(scores))):
        penalty = np.where(np.isfinite(closest), closest, 0.0)
        value = np.where(left, balance * rel - (1 - balance) * penalty, -np.inf)
        pick = int(np.argmax(value))
        chosen.append(pick)
        left[pick] = False
        closest = np.maximum(closest, vecs @ vecs[pick])
    return chosen


def link_total(links: Mapping[str, float]) -> float:
    """The sum of a note's positive link weights (what its connection boost grows with)."""
    return sum(max(w, 0.0) for w in links.values())


def boost_of(total: float, scale: float = BOOST_SCALE) -> float:
    """The connection boost of a note whose positive link weights sum to ``total``."""
    if scale == 0:
        return 1.0
    return min(1.0 + scale * math.log1p(total), MAX_BOOST)


def score_ceiling(relevance: float, boost_scale: float = BOOST_SCALE) -> float:
    """The highest score a note of this relevance can reach: full importance, just accessed,
    and the largest connection boost the scale allows."""
    return max(relevance, 0.0) * 1.5 * 1.0 * (MAX_BOOST if boost_scale > 0 else 1.0)


def score_parts(
    relevance: float,
    importance: float,
    last_access: float,
    created_at: float,
    link_sum: float,
    *,
    now: float,
    half_life_s: float,
    boost_scale: float = BOOST_SCALE,
) -> Parts:
    """The parts of a note's score; ``link_sum`` is its ``link_total``."""
    return Parts(
        relevance=relevance,
        importance=min(max(importance, 0.0), 1.0),
        recency=recency(now, last_access, created_at, half_life_s),
        connection_boost=boost_of(link_sum, boost_scale),
    )
