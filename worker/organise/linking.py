"""Link policy (pure): which candidates a new note links to, with what weight and reason.

The heuristic judge links a candidate when its cosine passes the threshold and the two notes
share keywords that are rare enough (the sum of their IDFs reaches ``min_shared``: one shared
uncommon word, not a name that half the notes carry), or when the cosine alone is strong
(threshold + STRONG_MARGIN). Each new note keeps at most ``max_links`` links, strongest first.
Pairs inside one batch are judged too.

Every link carries a relation label (RELATIONS for judged links; "sequence" for Folgezettel
links) and its source: the rule that made it ("rule:similarity", "rule:sequence") or the model
that judged it ("model:<name>"). ``store.degree.cap_degree`` keeps every note at most
``max_degree`` links by dropping the weakest.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from worker.store.notes import Link

STRONG_MARGIN = 0.15  #: cosine above threshold + this links without a shared keyword
#: Relation labels a judged link may carry: "related" is what the heuristic judge says; the LLM
#: judge picks the most specific one ("updates": the new note revises or replaces the other;
#: "contradicts": they disagree; "supports": it gives evidence for the other; "elaborates": it
#: adds detail; "example_of": it is an instance of the other).
RELATIONS = ("related", "supports", "elaborates", "contradicts", "updates", "example_of")
SEQUENCE = "sequence"  #: label and reason of a Folgezettel link
#: How far from unit length a batch's rows may be and still be scored by their dot products:
#: rows of an embedder (unit length up to float32 rounding) are; float16-stored ones are not.
UNIT_TOLERANCE = 1e-6


class Candidate(NamedTuple):
    """An existing or same-batch note a new note might link to. (Tuples: a batch makes tens of
    thousands of candidates and links.)"""

    note_id: str
    similarity: float
    keywords: Collection[str]  #: an indexed note's are a tuple (worker/index/projection.py)


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
    strong = threshold + STRONG_MARGIN
    near = [c for c in candidates if c.similarity >= threshold]
    near.sort(key=itemgetter(1), reverse=True)  # stable: ties keep their order
    for note_id, similarity, keywords in near:
        if len(accepted) >= max_links:
            break
        if note_id == new_id or note_id in seen:
            continue
        common = new_keywords.intersection(keywords)
        if common:
            shared = sorted([(-rarity(kw), kw) for kw in common])  # rarest first
            evidence = -sum([minus for minus, _ in shared]) >= min_shared
        else:
            evidence = False
        if not evidence and similarity < strong:
            continue
        seen.add(note_id)
        reason = f"cosine {similarity:.2f}"
        if evidence:
            reason += "; shared " + ", ".join([kw for _, kw in shared[:5]])
        accepted.append(Link(new_id, note_id, round(similarity, 4), reason))
    return accepted


def batch_candidates(
    ids: Sequence[str],
    vecs: npt.NDArray[np.float32],
    keywords: Sequence[Collection[str]],
    k: int,
) -> list[list[Candidate]]:
    """For each note of a batch, its k most similar *earlier* notes of the same batch, most
    similar first (ties: the earlier note first)."""
    n = len(ids)
    if n < 2 or k == 0:
        return [[] for _ in ids]
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    if not np.allclose(norms, 1.0, rtol=0.0, atol=UNIT_TOLERANCE):  # cosines, as the index has
        vecs = (vecs / np.where(norms > 0, norms, 1)).astype(np.float32)
    sims = vecs @ vecs.T
    sims[np.triu_indices(n)] = -np.inf  # a note's candidates come before it
    width = min(k, n - 1)
    top = np.argpartition(-sims, width - 1, axis=1)[:, :width]
    vals = np.take_along_axis(sims, top, axis=1)
    order = np.lexsort((top, -vals), axis=1)
    rows = np.take_along_axis(top, order, axis=1).tolist()
    scores = np.take_along_axis(vals, order, axis=1).tolist()
    return [
        [Candidate(ids[j], v, keywords[j]) for j, v in zip(rows[i][:i], scores[i][:i], strict=True)]
        for i in range(n)
    ]


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
        best[pair] = Link(strong.a, strong.b, strong.weight, reasons, strong.label, strong.source)
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
            links.append(
                Link(step.note_id, previous.note_id, weight, SEQUENCE, SEQUENCE, "rule:sequence")
            )
        previous = step
    return links
