"""Link policy (pure): which candidates a new note links to, with what weight and reason.

The heuristic judge links a candidate when its cosine passes the threshold and the two notes
share a keyword, or when the cosine alone is strong (threshold + STRONG_MARGIN). Each new note
keeps at most ``max_links`` links, strongest first. Pairs inside one batch are judged too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

STRONG_MARGIN = 0.15  #: cosine above threshold + this links without a shared keyword


@dataclass(frozen=True)
class Candidate:
    """An existing or same-batch note a new note might link to."""

    note_id: str
    similarity: float
    keywords: frozenset[str]


@dataclass(frozen=True)
class Link:
    """A proposed undirected link ``a`` - ``b``."""

    a: str
    b: str
    weight: float
    reason: str


def judge(
    new_id: str,
    new_keywords: frozenset[str],
    candidates: Sequence[Candidate],
    threshold: float,
    max_links: int,
) -> list[Link]:
    """The links the heuristic judge accepts for one new note, strongest first."""
    accepted: list[Link] = []
    seen: set[str] = set()
    for cand in sorted(candidates, key=lambda c: -c.similarity):
        if len(accepted) >= max_links:
            break
        if cand.note_id == new_id or cand.note_id in seen or cand.similarity < threshold:
            continue
        shared = sorted(new_keywords & cand.keywords)
        if not shared and cand.similarity < threshold + STRONG_MARGIN:
            continue
        seen.add(cand.note_id)
        reason = f"cosine {cand.similarity:.2f}"
        if shared:
            reason += "; shared " + ", ".join(shared[:5])
        accepted.append(Link(new_id, cand.note_id, round(cand.similarity, 4), reason))
    return accepted


def batch_candidates(
    ids: Sequence[str],
    vecs: npt.NDArray[np.float32],
    keywords: Sequence[frozenset[str]],
    k: int,
) -> list[list[Candidate]]:
    """For each note of a batch, its k most similar *earlier* notes of the same batch."""
    if len(ids) < 2 or k == 0:
        return [[] for _ in ids]
    sims = vecs @ vecs.T
    out: list[list[Candidate]] = []
    for i in range(len(ids)):
        if i == 0:
            out.append([])
            continue
        row = sims[i, :i]
        top = np.argsort(-row)[:k]
        out.append([Candidate(ids[j], float(row[j]), keywords[j]) for j in top])
    return out


def dedupe_links(links: Sequence[Link]) -> list[Link]:
    """One link per unordered pair, keeping the strongest."""
    best: dict[tuple[str, str], Link] = {}
    for link in links:
        pair = (link.a, link.b) if link.a < link.b else (link.b, link.a)
        if pair not in best or link.weight > best[pair].weight:
            best[pair] = link
    return list(best.values())
