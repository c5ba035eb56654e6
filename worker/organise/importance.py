"""Importance: a periodic per-namespace score in [0, 1] that search ranking multiplies in.

importance = PRIOR_WEIGHT x prior + CENTRALITY_WEIGHT x centrality
             + RECENCY_WEIGHT x recency + REINFORCEMENT_WEIGHT x reinforcement

- prior: the caller's ``importance`` hint (0.5 when none was given). The hint is kept in
  ``importance_prior`` and the value this job wrote in ``importance_auto``; a note whose
  ``importance`` no longer equals ``importance_auto`` was re-stored with a new hint, which
  becomes its prior.
- centrality: PageRank over the link weights, as c / (1 + c) with c = rank x notes, so a note
  of average rank gets 0.5.
- recency: 0.5 ** (time since last access, or creation / recency half-life).
- reinforcement: access_count / (access_count + REINFORCE_HALF): retrievals raise it.

Policy (``pagerank``, ``score_importance``) is pure; ``importance_namespace`` reads the graph,
then writes the notes whose importance changed in chunks, each chunk one MULTI/EXEC under the
namespace lock that HSETs only the importance fields, skips notes changed meanwhile and appends
one "importance" audit entry with before/after of the notes that moved more than AUDIT_DELTA.
Beat (``worker.organise.periodic``) scores a namespace when it changed since the job's last run
there, or when that run is older than MAX_AGE_S, so decay and retrievals are still reflected in a
namespace nobody writes to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from worker.context import WorkerContext
from worker.organise.decay import recency
from worker.store import notes
from worker.store.graph import Graph, read_graph
from worker.store.lease import Lease

log = logging.getLogger(__name__)

Floats = npt.NDArray[np.float64]

DAMPING = 0.85  #: PageRank damping factor
TOLERANCE = 1e-10  #: PageRank stops once an iteration moves the ranks less than this (L1)
MAX_ITERATIONS = 200  #: PageRank iterations at most
PRIOR_WEIGHT = 0.4  #: share of the caller's hint in importance
CENTRALITY_WEIGHT = 0.3  #: share of graph centrality
RECENCY_WEIGHT = 0.2  #: share of recency since last access
REINFORCEMENT_WEIGHT = 0.1  #: share of reinforcement by retrievals
REINFORCE_HALF = 5  #: retrievals that give half the reinforcement
DEFAULT_PRIOR = 0.5  #: prior of a note without an importance field
AUDIT_DELTA = 0.05  #: a move larger than this is listed in the run's audit entry
WRITE_DELTA = 1e-4  #: a smaller move is not written
MAX_AGE_S = 86_400.0  #: a namespace is rescored at least this often, changed or not
WRITE_CHUNK = 5_000  #: notes per MULTI/EXEC (and per audit entry)
AUDIT_ID = "*"  #: note id of namespace-wide audit entries
FIELDS = (
    "importance",
    "importance_auto",
    "importance_prior",
    "access_count",
    "last_access",
    "created_at",
)


@dataclass(frozen=True)
class Edges:
    """A weighted directed graph over notes 0..n-1 as parallel arrays."""

    n: int
    src: npt.NDArray[np.int64]
    dst: npt.NDArray[np.int64]
    weight: Floats


@dataclass(frozen=True)
class Signals:
    """What importance is computed from, for one note."""

    id: str
    importance: float
    prior: float
    access_count: int
    last_access: float
    created_at: float


@dataclass(frozen=True)
class Update:
    id: str
    before: float
    after: float
    prior: float


def pagerank(adjacency: Edges, damping: float = DAMPING) -> Floats:
    """PageRank by power iteration over weighted edges (negative weights count as 0); a note
    without out-links spreads its rank evenly. The scores sum to 1."""
    n = adjacency.n
    if n == 0:
        return np.zeros(0)
    src, dst = adjacency.src, adjacency.dst
    weight = np.clip(adjacency.weight.astype(np.float64), 0.0, None)
    out = np.bincount(src, weights=weight, minlength=n)
    share = np.divide(weight, out[src], out=np.zeros_like(weight), where=out[src] > 0)
    dangling = out == 0
    rank = np.full(n, 1.0 / n)
    for _ in range(MAX_ITERATIONS):
        flow = np.bincount(dst, weights=rank[src] * share, minlength=n)
        new = (1 - damping) / n + damping * (flow + rank[dangling].sum() / n)
        done = float(np.abs(new - rank).sum()) < TOLERANCE
        rank = new
        if done:
            break
    return np.asarray(rank / rank.sum(), dtype=np.float64)


def edges_of(ids: Sequence[str], links: Mapping[str, Mapping[str, float]]) -> Edges:
    """The link map as Edges over the positions of ``ids`` (links to other ids are dropped)."""
    pos = {nid: i for i, nid in enumerate(ids)}
    triples = [(pos[a], pos[b], w) for a in ids for b, w in links.get(a, {}).items() if b in pos]
    src, dst, weight = zip(*triples, strict=True) if triples else ((), (), ())
    return Edges(
        len(ids),
        np.asarray(src, dtype=np.int64),
        np.asarray(dst, dtype=np.int64),
        np.asarray(weight, dtype=np.float64),
    )


def prior_of(importance: float, auto: float | None, prior: float | None) -> float:
    """The caller's hint: the stored prior, unless importance was set since this job wrote it."""
    if prior is None or auto is None or abs(importance - auto) > 1e-9:
        return importance
    return prior


def score_importance(
    signals: Sequence[Signals], ranks: Floats, now: float, half_life_s: float
) -> list[float]:
    """Each note's importance (rounded to 4 places) from its signals and PageRank."""
    scaled = ranks * len(signals)
    centrality = scaled / (1.0 + scaled)
    out = []
    for s, c in zip(signals, centrality, strict=True):
        value = (
            PRIOR_WEIGHT * s.prior
            + CENTRALITY_WEIGHT * float(c)
            + RECENCY_WEIGHT * recency(now, s.last_access, s.created_at, half_life_s)
            + REINFORCEMENT_WEIGHT * s.access_count / (s.access_count + REINFORCE_HALF)
        )
        out.append(round(min(max(value, 0.0), 1.0), 4))
    return out


def select_updates(signals: Sequence[Signals], scores: Sequence[float]) -> list[Update]:
    """The notes whose stored importance (or prior) needs writing."""
    return [
        Update(s.id, s.importance, new, s.prior)
        for s, new in zip(signals, scores, strict=True)
        if abs(new - s.importance) > WRITE_DELTA
    ]


def importance_namespace(ctx: WorkerContext, ns: str) -> int:
    """Rescore every active note of ``ns``; return how many notes' importance was written."""
    started = time.perf_counter()
    now = time.time()
    graph = read_graph(ctx, ns, FIELDS)
    signals = [_signals(nid, graph) for nid in graph.ids]
    ranks = pagerank(edges_of(graph.ids, graph.links))
    half_life_s = ctx.settings.recency_half_life_days * 86_400
    updates = select_updates(signals, score_importance(signals, ranks, now, half_life_s))
    written = sum(
        _commit(ctx, ns, updates[i : i + WRITE_CHUNK]) for i in range(0, len(updates), WRITE_CHUNK)
    )
    ctx.redis.hset(ctx.keys.stats(ns), "last_importance", now)
    log.info(
        "importance ns=%s notes=%d written=%d in %.1fms",
        ns,
        len(signals),
        written,
        (time.perf_counter() - started) * 1000,
    )
    return written


def _signals(nid: str, graph: Graph) -> Signals:
    f = graph.fields[nid]
    importance = _float(f["importance"], DEFAULT_PRIOR)
    return Signals(
        nid,
        importance,
        prior_of(importance, _maybe(f["importance_auto"]), _maybe(f["importance_prior"])),
        int(_float(f["access_count"], 0.0)),
        _float(f["last_access"], 0.0),
        _float(f["created_at"], 0.0),
    )


def _float(raw: bytes | None, default: float) -> float:
    return float(raw) if raw is not None else default


def _maybe(raw: bytes | None) -> float | None:
    return float(raw) if raw is not None else None


def _commit(ctx: WorkerContext, ns: str, updates: list[Update]) -> int:
    """Write one chunk under the namespace lock, skipping notes deleted or re-stored since they
    were read; return how many were written."""
    keys = ctx.keys
    with (
        Lease(ctx.redis, keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer) as lease,
        lease.kept(),
    ):
        check = ctx.redis.pipeline(transaction=False)
        for u in updates:
            check.hmget(keys.note(ns, u.id), ["status", "importance"])
        keep = [
            u
            for u, (status, imp) in zip(updates, check.execute(), strict=True)
            if status == b"active" and _float(imp, DEFAULT_PRIOR) == u.before
        ]
        if not keep:
            return 0
        pipe = ctx.redis.pipeline(transaction=True)
        notes.changed(pipe, keys, ns)
        for u in keep:
            mapping = {
                "importance": u.after,
                "importance_auto": u.after,
                "importance_prior": u.prior,
            }
            pipe.hset(keys.note(ns, u.id), mapping=mapping)
        moved = [u for u in keep if abs(u.after - u.before) > AUDIT_DELTA]
        if moved:
            notes.audit(
                pipe,
                keys,
                ns,
                "importance",
                AUDIT_ID,
                actor="worker",
                source="importance",
                before={u.id: u.before for u in moved},
                after={u.id: u.after for u in moved},
            )
        pipe.execute()
    return len(keep)
