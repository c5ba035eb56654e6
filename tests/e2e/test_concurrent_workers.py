"""Fault injection: two worker processes organise the same namespaces at once, while three
producers store and search concurrently.

"The same notes and links as one worker" is checked on what must not depend on batching or arrival
order: with ZQ_LINK_K and ZQ_MAX_LINKS above the namespace's size and ZQ_MAX_DEGREE off the caps
never bind, so every pair whose cosine passes the threshold by STRONG_MARGIN must be linked
(whatever the keywords, which depend on what the namespace held at the time), by two workers as by
one; a link missed between notes organised concurrently, or overwritten by a racing commit, shows
as a missing pair. Every link's weight is its pair's cosine. Access counts must equal the hits
searches returned (no lost increment), importance the last value stored (no lost update), and two
shards' leases are seen held at the same instant by different processes.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from producer import MemoryClient
from producer.keys import Keys
from producer.protocol import link_weights
from tests.conftest import drain_all, make_settings
from tests.e2e.workers import running, wait_ready
from worker import vectors
from worker.context import WorkerContext
from worker.organise.linking import STRONG_MARGIN
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

SHARDS = 4
#: above the namespace size, degree cap off: caps never bind
CAPS = {"link_k": 200, "max_links": 200, "max_degree": 0}
RACE = "race"
TOPICS = ["redis stream", "faiss index", "celery worker", "audit log", "link graph", "lease"]
PER_PRODUCER = 50
PRODUCERS = 3
IMPORTANCE_STEPS = (0.1, 0.3, 0.6, 0.9)
#: Notes queued on each of two other shards: enough that their drains (seconds each) overlap.
BACKLOG = 3000


def _distinct_shard_namespaces() -> tuple[str, str]:
    keys = Keys(shard_count=SHARDS)
    taken = {keys.shard_of(RACE)}
    found = []
    for i in range(100):
        ns = f"parallel-{i}"
        if keys.shard_of(ns) not in taken:
            taken.add(keys.shard_of(ns))
            found.append(ns)
    return found[0], found[1]


PARALLEL = _distinct_shard_namespaces()


def _race_notes(producer: int) -> list[dict[str, str]]:
    return [
        {
            "id": f"p{producer}-{i}",
            "content": f"{TOPICS[(i + producer) % len(TOPICS)]} note {i} by producer {producer}",
        }
        for i in range(PER_PRODUCER)
    ]


def _produce(settings: WorkerSettings, producer: int, hits: Counter[str]) -> None:
    with MemoryClient(settings) as mem:
        notes = _race_notes(producer)
        for start in range(0, len(notes), 5):
            mem.store_many(notes[start : start + 5], namespace=RACE)
            for h in mem.search(TOPICS[start % len(TOPICS)], namespace=RACE, k=4):
                hits[h.id] += 1
        for step in IMPORTANCE_STEPS:  # one writer: the last value stored must win
            mem.store(
                f"ranked fact {producer}", namespace=RACE, id=f"imp-{producer}", importance=step
            )


def _queue_backlog(mem: MemoryClient) -> None:
    """A backlog on two shards, so both workers have work at once."""
    for ns in PARALLEL:
        for start in range(0, BACKLOG, 500):
            batch = range(start, start + 500)
            mem.store_many([f"{TOPICS[i % 6]} backlog {i}" for i in batch], namespace=ns)


def _watch_leases(ctx: WorkerContext, stop: threading.Event, seen: set[frozenset[str]]) -> None:
    keys = [ctx.keys.lease(ctx.keys.shard_of(ns)) for ns in PARALLEL]
    while not stop.is_set():
        tokens = ctx.redis.mget(keys)
        if all(tokens):
            seen.add(frozenset(t.split(b"/")[0].decode() for t in tokens))


def _graph(ctx: WorkerContext, ns: str) -> dict[str, dict[str, float]]:
    ids = [m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)]
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hgetall(ctx.keys.links(ns, nid))
    return {nid: link_weights(row) for nid, row in zip(ids, pipe.execute(), strict=True)}


def _pairs(graph: dict[str, dict[str, float]]) -> set[tuple[str, str]]:
    return {(a, b) if a < b else (b, a) for a, nbs in graph.items() for b in nbs}


def _strong_pairs(
    ctx: WorkerContext, ns: str, threshold: float
) -> tuple[set[tuple[str, str]], dict[tuple[str, str], float]]:
    """Pairs whose cosine alone obliges the judge to link them, whatever their keywords, the
    batching or the order; and every pair's cosine, from the stored vectors."""
    ids = sorted(m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1))
    raw = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        raw.hget(ctx.keys.note(ns, nid), "vec")
    vecs = np.vstack([vectors.decode(v) for v in raw.execute()])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)  # as the index does
    sims = vecs @ vecs.T
    cosine = {(a, b): float(sims[i, j]) for i, a in enumerate(ids) for j, b in enumerate(ids)}
    strong = {(a, b) for (a, b), c in cosine.items() if a < b and c >= threshold + STRONG_MARGIN}
    return strong, cosine


def _single_worker_graph(tmp_path: Path, url: str) -> dict[str, dict[str, float]]:
    settings = make_settings(tmp_path, redis_url=url, shard_count=SHARDS, **CAPS)
    ctx = WorkerContext.build(settings)
    try:
        with MemoryClient(settings) as mem:
            for producer in range(PRODUCERS):
                mem.store_many(_race_notes(producer), namespace=RACE)
                mem.store(f"ranked fact {producer}", namespace=RACE, id=f"imp-{producer}")
        drain_all(ctx)
        return _graph(ctx, RACE)
    finally:
        ctx.close()


def test_two_workers_produce_the_graph_one_would_and_lose_no_update(tmp_path, own_redis):
    settings = make_settings(tmp_path, redis_url=own_redis.url, shard_count=SHARDS, **CAPS)
    # sequence links (weight ZQ_SEQUENCE_WEIGHT, not a cosine) are off: this test is about
    # similarity links organised concurrently
    env = {
        "ZQ_LINK_K": "200",
        "ZQ_MAX_LINKS": "200",
        "ZQ_MAX_DEGREE": "0",
        "ZQ_SEQUENCE_WEIGHT": "0",
    }
    ctx = WorkerContext.build(settings)
    hits: Counter[str] = Counter()
    seen: set[frozenset[str]] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_leases, args=(ctx, stop, seen), daemon=True)
    try:
        with MemoryClient(settings) as mem, running(settings, count=2, **env):
            wait_ready(settings, 2)  # else the first worker up may drain both shards alone
            _queue_backlog(mem)
            watcher.start()
            producers = [
                threading.Thread(target=_produce, args=(settings, p, hits), daemon=True)
                for p in range(PRODUCERS)
            ]
            for t in producers:
                t.start()
            for t in producers:
                t.join(60)
            for ns in (RACE, *PARALLEL):
                mem.flush(ns, timeout_s=60)
            assert [mem.stats(ns).notes for ns in PARALLEL] == [BACKLOG, BACKLOG]
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(5)
    try:
        assert any(len(owners) == 2 for owners in seen), "two shards never drained in parallel"
        graph = _graph(ctx, RACE)
        assert len(graph) == PRODUCERS * (PER_PRODUCER + 1)
        strong, cosine = _strong_pairs(ctx, RACE, settings.link_threshold)
        assert len(strong) > 100, "the input must hold many pairs that have to link"
        assert strong <= _pairs(graph), f"missed links: {sorted(strong - _pairs(graph))[:5]}"
        assert strong <= _pairs(_single_worker_graph(tmp_path, own_redis.url))
        for a, nbs in graph.items():
            for b, weight in nbs.items():
                assert weight == pytest.approx(cosine[a, b], abs=2e-4)
                assert weight >= settings.link_threshold - 2e-4
        counts = {
            nid: int(ctx.redis.hget(ctx.keys.note(RACE, nid), "access_count") or 0) for nid in graph
        }
        assert counts == {nid: hits.get(nid, 0) for nid in graph}, "lost access-count updates"
        for p in range(PRODUCERS):
            note = ctx.redis.hmget(ctx.keys.note(RACE, f"imp-{p}"), ["importance", "version"])
            assert (float(note[0]), int(note[1])) == (IMPORTANCE_STEPS[-1], len(IMPORTANCE_STEPS))
        for ns in (RACE, *PARALLEL):
            assert check_namespace(ctx, ns) == []
    finally:
        ctx.close()
