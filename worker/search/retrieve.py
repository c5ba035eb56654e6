"""Answer a SearchJob: wait for freshness (worker/intake/freshness.py), fuse the lexical and dense
channels, spread along links, rank with the composite score, reinforce what is returned; render
context text (worker/search/rendering.py)."""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from producer import validation as v
from producer.errors import InvalidInput
from producer.protocol import Hit, Reply, SearchJob
from worker import metrics
from worker.bulk import BulkPipeline, fields
from worker.context import WorkerContext
from worker.errors import NotFresh
from worker.index.lexical import analyze
from worker.index.projection import CATCH_UP_CHUNK, Projection, catch_up
from worker.index.rows import Pinned, Tag
from worker.intake.freshness import queue_inbox_reads, wait_fresh
from worker.search import candidates as cands_
from worker.search import ranking
from worker.search.candidates import FILTERED, RANK, Cand, Rows
from worker.search.rendering import render_context
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

EXPAND_SEEDS = 10  #: how many top notes have their links followed per hop
MMR_POOL = 3  #: diversity re-ranks the best k x this many candidates
#: A neighbour reached over a link is fetched only when its flow is at least this share of the
#: k-th best relevance so far (the composite factors cannot lift it further than that).
PRUNE_SHARE = 0.5
DEADLINE_SLACK_S = 60.0  #: how far a producer's clock may run ahead of the worker's


def handle(ctx: WorkerContext, job: SearchJob, ahead: Probe | None = None) -> Reply | None:
    """The reply to ``job``, or None when the caller has already given up on it; ``ahead``
    holds the first round trip's reads when they were made behind the job's BRPOP."""
    now = time.time()
    try:
        job = checked(ctx.settings, job, now)
    except InvalidInput as exc:
        log.warning("refused %s job_id=%s: %s", job.kind, job.job_id, exc)
        return Reply(job_id=job.job_id, ok=False, error=f"refused: {exc}")
    if now > job.deadline:
        log.warning("dropped expired %s job_id=%s", job.kind, job.job_id)
        metrics.count_expired_search()
        return None
    try:
        if job.kind == "flush":
            wait_fresh(ctx, job.namespaces, job.deadline)
            return Reply(job_id=job.job_id)
        if job.kind == "embed":
            return embed(ctx, job)
        hits = search(ctx, job, ahead)
    except NotFresh as exc:
        return Reply(job_id=job.job_id, ok=False, error=str(exc))
    text = render_context(hits, job.max_tokens) if job.kind == "context" else ""
    return Reply(job_id=job.job_id, hits=hits, text=text)


def checked(s: WorkerSettings, job: SearchJob, now: float) -> SearchJob:
    """``job`` as read from Redis, checked against the limits the producer applies (anyone who
    may push to a search list can send any value) and normalised; InvalidInput names the first
    field out of bounds. The deadline may be at most MAX_TIMEOUT_S (+ DEADLINE_SLACK_S for
    clocks that disagree) ahead: a flush waits until it."""
    names = job.namespaces
    if not 0 < len(names) <= v.MAX_NAMESPACES or len(set(names)) != len(names):
        raise InvalidInput(f"namespaces must be 1 to {v.MAX_NAMESPACES} distinct names")
    for ns in names:
        v.check_namespace(ns)
    if job.kind not in ("flush", "embed"):  # embed's texts are checked by embed()
        v.check_text(job.query, "query", s.max_content_bytes)
    v.check_int(job.k, "k", 1, s.max_k)
    v.check_int(job.hops, "hops", 0, v.MAX_HOPS)
    v.check_time(job.as_of, "as_of")
    v.check_unit_float(job.diversity, "diversity")
    v.check_unit_float(job.min_relevance, "min_relevance")
    v.check_int(job.max_tokens, "max_tokens", v.MIN_CONTEXT_TOKENS, v.MAX_CONTEXT_TOKENS)
    check_deadline(job.deadline, now)
    update = {"filters": v.check_filters(job.filters, s), "weights": v.check_weights(job.weights)}
    return job.model_copy(update=update)


def check_deadline(deadline: float, now: float) -> None:
    """A deadline read from Redis may be at most MAX_TIMEOUT_S (+ slack for clocks) ahead."""
    if not math.isfinite(deadline) or deadline > now + v.MAX_TIMEOUT_S + DEADLINE_SLACK_S:
        raise InvalidInput(f"deadline must be at most {v.MAX_TIMEOUT_S:.0f} s ahead")


def embed(ctx: WorkerContext, job: SearchJob) -> Reply:
    """The worker's vectors of ``job.texts``, one float32 little-endian row each; refused past
    the producer's limits (ZQ_MAX_BATCH texts of ZQ_MAX_CONTENT_BYTES)."""
    s = ctx.settings
    too_long = any(len(t.encode("utf-8", "surrogatepass")) > s.max_content_bytes for t in job.texts)
    if len(job.texts) > s.max_batch or too_long:
        return Reply(job_id=job.job_id, ok=False, error="embed texts over ZQ_MAX_BATCH or size")
    rows = ctx.embedder.embed(job.texts).astype("<f4", copy=False)
    vectors = [row.tobytes() for row in rows]
    return Reply(job_id=job.job_id, vectors=vectors, embedder=ctx.embedder.name)


def search(ctx: WorkerContext, job: SearchJob, ahead: Probe | None = None) -> list[Hit]:
    s = ctx.settings
    qvec = ctx.embedder.embed([job.query])
    terms = analyze(job.query)
    now = time.time()
    filters = {**job.filters, "as_of": job.as_of} if job.as_of is not None else job.filters
    weights = {
        "dense": s.dense_weight_for,
        "lexical": s.lexical_weight,
        "graph": s.graph_weight,
        "feedback": s.feedback_weight,
    }
    weights.update(job.weights)
    pools, rows = _first_stage(ctx, job, qvec, terms, weights, filters, ahead)
    for hop in range(1, job.hops):
        for ns, pool in pools.items():
            _expand(ctx, rows, ns, pool, hop, filters, weights["graph"], job.k)
    at = now if job.as_of is None else job.as_of
    width = job.k * MMR_POOL if job.diversity > 0 else job.k
    ranked = _last_hop(ctx, rows, pools, job, filters, weights["graph"], width, now, at, qvec)
    if job.diversity > 0:
        ranked = ranked[:width]
        cands_.load_hit_fields(ctx, rows, ranked, qvec, ctx.embedder.name)
        ranked = _diversify(ranked, job.k, job.diversity)
        ranked.sort(key=lambda c: cands_.superseded(c, at))
    top = ranked[: job.k]
    cands_.load_hit_fields(ctx, rows, top, qvec, ctx.embedder.name)
    for ns in job.namespaces:  # a search of namespaces nobody wrote keeps nothing of them
        ctx.drop_if_empty(ns)
    return cands_.to_hits(rows, top)


@dataclass
class _Plan:
    """A namespace's first-stage channels as drawn from its projection at ``position``."""

    position: str
    channels: dict[str, dict[str, float]]
    relevance: dict[str, float]


def _first_stage(
    ctx: WorkerContext,
    job: SearchJob,
    qvec: npt.NDArray[np.float32],
    terms: list[str],
    weights: dict[str, float],
    filters: dict[str, Any],
    ahead: Probe | None,
) -> tuple[dict[str, dict[str, Cand]], Rows]:
    """Each namespace's dense and lexical candidates, fused, with their ranking fields (and the
    links of those a hop or the connection boost needs), unscored; and the row caches as this
    search uses them.

    The freshness wait (for ``job.fresh``), the read of each change log past its projection,
    of each namespace's version and the candidates' fetch share one round trip while every
    projection was caught up at its last search: the candidates are then drawn from the
    projections as they are (their rows from the cache where it holds them), and drawn again
    after catching up only if that read found changes or a new version. Otherwise the
    projections are caught up first and the candidates fetched in a second round trip.
    ``ahead`` is that read as made behind the BRPOP that took the job (``Lookahead``): used when
    it is of these namespaces from the positions their projections are still at, it leaves
    only the fetch of the rows not kept (no round trip when all are)."""
    projs = [ctx.projection(ns) for ns in job.namespaces]
    settled = all(p.settled for p in projs)
    plans = {p.ns: _plan(ctx, p, qvec, terms, job.k, weights) for p in projs if settled}
    positions = {p.ns: plans[p.ns].position if settled else p.position for p in projs}
    expected = {p.ns: _pinned(ctx, p, p.rows.current()) for p in projs}
    pipe = BulkPipeline(ctx.redis)
    probe = ahead if ahead is not None and ahead.fits(job.namespaces, positions) else None
    if probe is None:
        probe = Probe.queue(pipe, ctx, job.namespaces, positions, job.fresh)
    fetches = {
        ns: _queue_fetch(pipe, ctx, expected, ns, p, job, weights, filters)
        for ns, p in plans.items()
    }
    replies = pipe.execute() if len(pipe) else []
    read = probe.replies if probe.replies is not None else replies
    waited = job.fresh and probe.wait(read, job.deadline)
    seen = {
        p.ns: p.rows.observe(version, _count(touches))
        for p, (version, touches) in zip(projs, probe.counters(read), strict=True)
    }
    rows = {p.ns: Pinned(None) if waited else _pinned(ctx, p, seen[p.ns][1]) for p in projs}
    pools: dict[str, dict[str, Cand]] = {}
    later = BulkPipeline(ctx.redis)
    for p, raw in zip(projs, probe.changes(read), strict=True):
        entries = [(eid, fields(flat)) for eid, flat in raw]
        p.settled = not waited and not entries and seen[p.ns][0]
        if p.settled and p.ns in fetches:
            pools[p.ns] = fetches[p.ns](replies)
            continue
        with p.lock:
            catch_up(ctx, p, None if waited else (positions[p.ns], entries))
        p.settle_soon()
        plan = _plan(ctx, p, qvec, terms, job.k, weights)
        fetches[p.ns] = _queue_fetch(later, ctx, rows, p.ns, plan, job, weights, filters)
    replies = later.execute() if len(later) else []
    pools.update({ns: fetches[ns](replies) for ns in fetches if ns not in pools})
    return {ns: pools[ns] for ns in job.namespaces}, rows


@dataclass
class Probe:
    """The first round trip's reads of a search's namespaces: the last entry of each one's
    shard inbox (for the freshness wait), its change log past ``positions`` and its version
    and reinforcement count; ``replies`` holds them when they were read ahead."""

    namespaces: list[str]
    positions: dict[str, str]
    start: int  #: the index of the first change-log read among the pipeline's replies
    wait: Callable[[list[Any], float], bool]
    replies: list[Any] | None = None

    @classmethod
    def queue(
        cls,
        pipe: BulkPipeline,
        ctx: WorkerContext,
        namespaces: list[str],
        positions: dict[str, str],
        fresh: bool,
    ) -> Probe:
        """Queue the reads on ``pipe`` (the inbox reads only for a ``fresh`` search)."""
        wait = queue_inbox_reads(pipe, ctx, namespaces) if fresh else _never_waits
        start = len(pipe)
        for ns in namespaces:
            pipe.xrange(ctx.keys.changes(ns), min=f"({positions[ns]}", count=CATCH_UP_CHUNK)
        # before any fetch: a row read after a change is then kept under an older version
        for ns in namespaces:
            pipe.queue("MGET", ctx.keys.version(ns), ctx.keys.touches(ns))
        return cls(list(namespaces), dict(positions), start, wait)

    def fits(self, namespaces: list[str], positions: dict[str, str]) -> bool:
        """Whether these reads, made ahead, serve a search of ``namespaces`` whose projections
        are at ``positions``."""
        same = self.namespaces == namespaces and self.positions == positions
        return self.replies is not None and same

    def changes(self, replies: list[Any]) -> list[Any]:
        return replies[self.start : self.start + len(self.namespaces)]

    def counters(self, replies: list[Any]) -> list[Any]:
        n = len(self.namespaces)
        return replies[self.start + n : self.start + 2 * n]


def _never_waits(replies: list[Any], deadline: float) -> bool:
    return False


class Lookahead:
    """One search thread's guess at its next job's namespaces (those of its last search), so
    that the first round trip's reads (``Probe``) are queued behind the BRPOP that takes the
    job: Redis runs them as it hands the job over, after everything written before the job was
    pushed, so they answer the freshness check as well as reads made after taking it."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.namespaces: list[str] = []

    def queue(self, pipe: BulkPipeline) -> Probe | None:
        """Queue the reads of the last search's namespaces on ``pipe`` (after its BRPOP);
        None when there was none or this process no longer holds one of its projections."""
        held = self.ctx.held_projections()
        if not self.namespaces or any(ns not in held for ns in self.namespaces):
            return None
        positions = {ns: held[ns].position for ns in self.namespaces}
        return Probe.queue(pipe, self.ctx, self.namespaces, positions, fresh=True)

    def remember(self, job: SearchJob) -> None:
        """Guess ``job``'s namespaces for the next job, if it searched."""
        if job.kind in ("search", "context"):
            self.namespaces = list(job.namespaces)


def _count(raw: bytes | None) -> int | None:
    """A reinforcement count as read; None for one that is not a count (a key anyone who may
    write it could plant), under which no row is kept."""
    if raw is None:
        return 0
    return int(raw) if raw.isdigit() else None


def _pinned(ctx: WorkerContext, proj: Projection, tag: Tag) -> Pinned:
    """The projection's row cache under ``tag``, or none when ZQ_SEARCH_CACHE is off."""
    return Pinned(proj.rows, tag) if ctx.settings.search_cache else Pinned(None)


def _plan(
    ctx: WorkerContext,
    proj: Projection,
    qvec: npt.NDArray[np.float32],
    terms: list[str],
    k: int,
    weights: dict[str, float],
) -> _Plan:
    """The channels of ``proj`` as it is (not caught up), fused into relevance."""
    s = ctx.settings
    n = max(s.search_candidates, k)
    with proj.lock:
        position = proj.position
        channels = _channels(ctx, proj, qvec, terms, n, k, weights)
    if s.fusion == "rrf":
        relevance = ranking.fuse({k: list(v) for k, v in channels.items()}, weights, s.rrf_k)
    else:
        relevance = ranking.fuse_scores(channels, weights)
    return _Plan(position, channels, ranking.backfill(relevance, channels["dense"], k))


def _channels(
    ctx: WorkerContext,
    proj: Projection,
    qvec: npt.NDArray[np.float32],
    terms: list[str],
    n: int,
    k: int,
    weights: dict[str, float],
) -> dict[str, dict[str, float]]:
    """Each channel's candidates, best first, with their scores (cosine, BM25). The dense
    channel is also read when its weight is 0 but the lexical one found fewer than k notes
    (no shared word: a paraphrase), to backfill the hits. The caller holds ``proj.lock``."""
    hits: list[tuple[int, float]] = []
    if weights["lexical"] > 0:
        s = ctx.settings
        query = proj.lexical.complete(terms)
        query = proj.lexical.expand(
            query,
            s.feedback_docs,
            s.feedback_terms,
            weights["feedback"],
            s.feedback_term_max_notes,
        )
        hits = proj.lexical.search_weighted(query, n)
    lexical = {proj.ids[seq]: score for seq, score in hits if seq in proj.ids}
    size = len(proj.index)
    dense: dict[str, float] = {}
    backfill = weights["lexical"] > 0 and len(lexical) < k
    if size and (weights["dense"] > 0 or backfill):
        scores, seqs = proj.index.search(qvec, min(n, size), ctx.settings.ivf_search_share)
        dense = {
            proj.ids[q]: v
            for v, q in zip(scores[0].tolist(), seqs[0].tolist(), strict=True)
            if q >= 0 and q in proj.ids
        }
    return {"dense": dense, "lexical": lexical}


def _queue_fetch(
    pipe: BulkPipeline,
    ctx: WorkerContext,
    rows: Rows,
    ns: str,
    plan: _Plan,
    job: SearchJob,
    weights: dict[str, float],
    filters: dict[str, Any],
) -> Callable[[list[Any]], dict[str, Cand]]:
    """Queue the read of the plan's candidates: ranking fields, and links for the best
    ``EXPAND_SEEDS`` (a hop's seeds), or for all when the connection boost needs them. The
    decoder returns the active candidates that pass the filters, with their channel scores."""
    relevance, channels = plan.relevance, plan.channels
    cands = [Cand(nid, ns, 0, {}) for nid in relevance]
    linked: list[Cand] = []
    if ctx.settings.boost_scale > 0:
        linked = cands
    elif job.hops and weights["graph"] > 0:
        linked = sorted(cands, key=lambda c: -relevance[c.id])[:EXPAND_SEEDS]
    active = cands_.queue_rank_fields(pipe, ctx, rows, cands, filters)
    links = cands_.queue_links(pipe, ctx, rows, linked)

    def decoder(replies: list[Any]) -> dict[str, Cand]:
        links(replies)
        pool = {c.id: c for c in active(replies) if cands_.passes(c, filters)}
        for c in pool.values():
            c.relevance = relevance[c.id]
            c.lexical = channels["lexical"].get(c.id, 0.0)
            c.similarity = channels["dense"].get(c.id, 0.0)
        return pool

    return decoder


def _seeds(pool: dict[str, Cand], hop: int) -> list[Cand]:
    """The best notes reached at the hop before ``hop``: they spread relevance at ``hop``."""
    seeds = sorted((c for c in pool.values() if c.hop == hop - 1), key=lambda c: -c.relevance)
    return seeds[:EXPAND_SEEDS]


def _newcomers(pool: dict[str, Cand], flow: dict[str, float], k: int) -> list[str]:
    """Neighbours not yet seen whose flow could carry them near the top k (others cannot make
    the cut)."""
    ranked = sorted((c.relevance for c in pool.values()), reverse=True)
    bar = PRUNE_SHARE * ranked[k - 1] if len(ranked) >= k else 0.0
    return [nid for nid, value in flow.items() if nid not in pool and value >= bar]


def _expand(
    ctx: WorkerContext,
    rows: Rows,
    ns: str,
    pool: dict[str, Cand],
    hop: int,
    filters: dict[str, Any],
    graph_weight: float,
    k: int,
) -> None:
    """Spread relevance from the best notes along their links; fetch the neighbours not yet
    seen whose flow could carry them near the top k."""
    if graph_weight <= 0:
        return
    seeds = _seeds(pool, hop)
    cands_.load_links(ctx, rows, seeds)
    flow = ranking.spread({c.id: c.relevance for c in seeds}, _links(seeds), graph_weight)
    new = _newcomers(pool, flow, k)
    for c in cands_.fetch(ctx, rows, ns, new, hop, filters, set(new)):
        if cands_.passes(c, filters):
            pool[c.id] = c
    for nid, extra in flow.items():
        if nid in pool:
            pool[nid].relevance += extra


def _links(cands: list[Cand]) -> dict[str, dict[str, float]]:
    return {c.id: c.links or {} for c in cands}


def _last_hop(
    ctx: WorkerContext,
    rows: Rows,
    pools: dict[str, dict[str, Cand]],
    job: SearchJob,
    filters: dict[str, Any],
    graph_weight: float,
    width: int,
    now: float,
    at: float,
    qvec: npt.NDArray[np.float32],
) -> list[Cand]:
    """Every candidate at least ``job.min_relevance`` relevant, scored and ranked after the
    last hop's spreading (none for ``job.hops`` 0), with what a hit needs read for the best
    ``width`` in the same round trip as the hop's new neighbours.

    Spreading only adds the seeds' flow to the candidates already seen, so their final scores
    are known before the neighbours are read; a neighbour is read only when its flow times the
    largest composite factors could reach the ``width``-th of those scores, and then read in
    full (ranking fields, links and hit fields), as it may be returned."""
    s = ctx.settings
    half_life_s = s.recency_half_life_days * 86_400
    hop, k, floor_rel = job.hops, job.k, job.min_relevance
    flows = _spread(ctx, rows, pools, hop, graph_weight, k) if hop > 0 and graph_weight > 0 else {}
    ranked = cands_.rank_top(
        [c for pool in pools.values() for c in pool.values() if c.relevance >= floor_rel],
        width,
        lambda c: cands_.score(c, now, half_life_s, s.boost_scale),
        at,
        s.boost_scale,
    )
    floor = 0.0
    if len(ranked) >= width and not cands_.superseded(ranked[width - 1], at):
        floor = ranked[width - 1].score
    neighbours = [
        Cand(nid, ns, hop, {}, relevance=value)
        for ns, flow in flows.items()
        for nid, value in flow.items()
        if value >= floor_rel and ranking.score_ceiling(value, s.boost_scale) >= floor
    ]
    pipe = BulkPipeline(ctx.redis)
    active = cands_.queue_rank_fields(pipe, ctx, rows, neighbours, filters)
    hit_fields = cands_.queue_hit_fields(
        pipe, ctx, rows, [*ranked[:width], *neighbours], qvec, ctx.embedder.name
    )
    replies = pipe.execute() if len(pipe) else []
    joined = [c for c in active(replies) if cands_.passes(c, filters)]
    hit_fields(replies)
    for c in joined:
        pools[c.ns][c.id] = c
        cands_.score(c, now, half_life_s, s.boost_scale)
        bisect.insort(ranked, c, key=cands_.order(at))
    return ranked


def _spread(
    ctx: WorkerContext,
    rows: Rows,
    pools: dict[str, dict[str, Cand]],
    hop: int,
    graph_weight: float,
    k: int,
) -> dict[str, dict[str, float]]:
    """Spread relevance from each namespace's best notes along their links (adding it to the
    candidates already seen); the flow to the neighbours not yet seen that could come near the
    top k, per namespace."""
    seeds = {ns: _seeds(pool, hop) for ns, pool in pools.items()}
    cands_.load_links(ctx, rows, [c for group in seeds.values() for c in group])
    news: dict[str, dict[str, float]] = {}
    for ns, pool in pools.items():
        relevance = {c.id: c.relevance for c in seeds[ns]}
        flow = ranking.spread(relevance, _links(seeds[ns]), graph_weight)
        news[ns] = {nid: flow[nid] for nid in _newcomers(pool, flow, k)}
        for nid, extra in flow.items():
            if nid in pool:
                pool[nid].relevance += extra
    return news


def _diversify(ranked: list[Cand], k: int, diversity: float) -> list[Cand]:
    """Maximal marginal relevance over the best candidates (vectors from the notes)."""
    vecs = [c.vec for c in ranked if c.vec is not None]
    if not ranked or len(vecs) != len(ranked):
        return ranked
    scores = np.asarray([c.score for c in ranked], dtype=np.float32)
    return [ranked[i] for i in ranking.mmr(scores, np.vstack(vecs), k, 1.0 - diversity)]


def touch(
    ctx: WorkerContext, pipe: BulkPipeline, hits: list[Hit], now: float
) -> Callable[[list[Any]], None]:
    """Reinforce what was returned: access_count + 1 and last_access = now (atomic HINCRBY),
    and count the reinforcement of each namespace (``Keys.touches``); queued on the reply's
    pipeline so it costs the caller no extra round trip. The returned function takes that
    pipeline's replies and updates the rows this process keeps (worker/index/rows.py)."""
    keys = ctx.keys
    for h in hits:
        key = keys.note(h.namespace, h.id)
        pipe.queue("HINCRBY", key, "access_count", 1)
        pipe.queue("HSET", key, "last_access", now)
    touched = {ns: [h.id for h in hits if h.namespace == ns] for ns in {h.namespace for h in hits}}
    start = len(pipe)
    for ns in touched:
        pipe.queue("INCR", keys.touches(ns))

    def counted(replies: list[Any]) -> None:
        held = ctx.held_projections()
        counts = replies[start : start + len(touched)]
        for (ns, ids), count in zip(touched.items(), counts, strict=True):
            proj = held.get(ns)
            if proj is not None:
                proj.rows.reinforced((RANK, FILTERED), ids, now, int(count))

    return counted
