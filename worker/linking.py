"""Link policy (pure): which candidates a new note links to, with what weight and reason.

The heuristic judge links a candidate when its cosine passes the threshold and the two notes
share keywords that are rare enough (the sum of their IDFs reaches ``min_shared``: one shared
uncommon word, not a name that half the notes carry), or when the cosine alone is strong
(threshold + STRONG_MARGIN). Each new note keeps at most ``max_links`` links, strongest first.
Pairs inside one batch are judged too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    rarity: Callable[[str], float] = lambda _: 1.0,
    min_shared: float = 0.0,
) -> list[Link]:
    """The links the heuristic judge accepts for one new note, strongest first.

    ``rarity`` weighs a shared keyword (an IDF); shared keywords count once their weights sum
    to ``min_shared``."""
    accepted: list[Link] = []
    seen: set[str] = set()
    for cand in sorted(candidates, key=lambda c: -c.similarity):
        if len(accepted) >= max_links:
            break
        if cand.note_id == new_id or cand.note_id in seen or cand.similarity < threshold:
            continue
        shared = sorted(new_keywords & cand.keywords, key=lambda kw: (-rarity(kw), kw))
        evidence = bool(shared) and sum(rarity(kw) for kw in shared) >= min_shared
        if not evidence and cand.similarity < threshold + STRONG_MARGIN:
            continue
        seen.add(cand.note_id)
        reason = f"cosine {cand.similarity:.2f}"
        if evidence:
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
    """One link per unordered pair with the strongest weight and every distinct reason (a pair
    can be both consecutive and similar: "sequence; cosine 0.42; shared sweden")."""
    best: dict[tuple[str, str], Link] = {}
    for link in links:
        pair = (link.a, link.b) if link.a < link.b else (link.b, link.a)
        known = best.get(pair)
        if known is None:
            best[pair] = link
            continue
        strong, weak = (link, known) if link.weight > known.weight else (known, link)
        reasons = (
            strong.reason if weak.reason in strong.reason else f"{strong.reason}; {weak.reason}"
        )
        best[pair] = Link(strong.a, strong.b, strong.weight, reasons)
    return list(best.values())


@dataclass(frozen=True)
class Step:
    """A note as the sequence policy sees it."""

    note_id: str
    event_time: float | None
    agent: str | None
    created_at: float


def same_episode(a: Step, b: Step, window_s: float) -> bool:
    """Two consecutive notes belong to one episode when they share an event_time (a session),
    or, with no event_time, come from the same agent within ``window_s`` seconds."""
    if a.event_time is not None or b.event_time is not None:
        return a.event_time == b.event_time
    return a.agent == b.agent and abs(b.created_at - a.created_at) <= window_s


def sequence_links(
    previous: Step | None, steps: Sequence[Step], window_s: float, weight: float
) -> list[Link]:
    """Folgezettel: link each note to the one stored just before it in the same episode."""
    if weight <= 0:
        return []
    links: list[Link] = []
    for step in steps:
        if previous is not None and same_episode(previous, step, window_s):
            links.append(Link(step.note_id, previous.note_id, weight, "sequence"))
        previous = step
    return links
