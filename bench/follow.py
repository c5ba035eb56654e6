"""What a process pays to follow a namespace another process organises, and what an update of a
note costs the lexical index: the CPU a search server (``zettelq searcher``, or a worker serving
a namespace it does not drain) spends on each note it did not organise itself.

Run from the tree to measure (``PYTHONPATH=<tree>``; the script needs only stable APIs, so one
copy of it serves two trees), on a Redis DB of your own that it flushes (DB 0 is refused)::

    PYTHONPATH=. .venv/bin/python bench/follow.py --notes 20000 --redis-url redis://127.0.0.1:6391/7

1. **follow**: a second ``WorkerContext`` (its own index directory, as another process) opens the
   namespace's projection while it is empty; ``--notes`` of ``foundation.py``'s seeded corpus
   are then stored and organised by the first context (``drain_shard`` in this process), and the
   second catches up from the change log in one ``catch_up``, as a search does: CPU per note
   (``time.process_time``, this process only: Redis's share is not in it). ``--repeats`` times,
   each with a fresh second context.
2. **rebuild**: a third context opens the projection cold (no snapshot: rebuilt from the
   namespace's notes), as a process does that starts without one: CPU per note.
3. **lexical update**: a ``LexicalIndex`` of ``--notes`` analysed corpus notes takes batches of
   256 new notes in which 5% are updates of random earlier notes (a remove and an add under the
   old seq), as ingest gives it, with no search between: microseconds per update and per add.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis import Redis

from bench.foundation import Corpus
from producer import MemoryClient
from worker.context import WorkerContext
from worker.index.lexical import LexicalIndex, analyze
from worker.index.projection import catch_up
from worker.intake.drain import drain_shard
from worker.settings import WorkerSettings

NAMESPACE = "follow"
SHARDS = 8
CHUNK = 500  #: notes per store_many() call
BATCH = 256  #: lexical phase: notes per ingest batch
UPDATES = 0.05  #: lexical phase: share of a batch that updates earlier notes


def settings(url: str) -> WorkerSettings:
    return WorkerSettings(
        redis_url=url,
        key_prefix="zqfollow",
        shard_count=SHARDS,
        index_dir=Path(tempfile.mkdtemp(prefix="zqfollow")),
        batch_wait_ms=0,
    )


def cpu_per_note(started: float, notes: int) -> float:
    return (time.process_time() - started) / notes * 1e6


def follow(url: str, notes: int, repeats: int) -> dict[str, Any]:
    """The follow and rebuild phases (CPU microseconds per note)."""
    s = settings(url)
    texts = [Corpus(7).note() for _ in range(notes)]
    followers = []
    for _ in range(repeats):
        other = WorkerContext.build(s.model_copy(update={"index_dir": settings(url).index_dir}))
        followers.append((other, other.projection(NAMESPACE)))
    with MemoryClient(s) as mem:
        for start in range(0, notes, CHUNK):
            mem.store_many(texts[start : start + CHUNK], namespace=NAMESPACE)
    ctx = WorkerContext.build(s)
    while sum(drain_shard(ctx, shard).processed for shard in range(SHARDS)):
        pass
    follow_us = []
    for other, proj in followers:
        started = time.process_time()
        with proj.lock:
            applied = catch_up(other, proj)
        follow_us.append(cpu_per_note(started, notes))
        assert applied and len(proj.ids) == notes, (applied, len(proj.ids))
        other.close()
    rebuild_us = []
    for _ in range(repeats):
        cold = WorkerContext.build(s.model_copy(update={"index_dir": settings(url).index_dir}))
        started = time.process_time()
        assert len(cold.projection(NAMESPACE).ids) == notes
        rebuild_us.append(cpu_per_note(started, notes))
        cold.close()
    ctx.close()
    return {
        "follow_us_per_note": [round(us, 1) for us in follow_us],
        "rebuild_us_per_note": [round(us, 1) for us in rebuild_us],
    }


def lexical_updates(notes: int) -> dict[str, Any]:
    """The lexical phase: microseconds per update and per add."""
    corpus, rng = Corpus(7), random.Random(7)
    extra = notes // 5
    terms = [analyze(corpus.note()) for _ in range(notes + extra)]
    index = LexicalIndex()
    for seq in range(notes):
        index.add(seq, terms[seq])
    updates: list[float] = []
    adds: list[float] = []
    seq = notes
    while seq < notes + extra:
        for _ in range(BATCH):
            old = rng.randrange(seq) if rng.random() < UPDATES else None
            started = time.perf_counter()
            index.add(seq if old is None else old, terms[rng.randrange(len(terms))])
            (adds if old is None else updates).append(time.perf_counter() - started)
            seq += old is None
    return {
        "lexical_update_us": round(statistics.mean(updates) * 1e6, 1),
        "lexical_add_us": round(statistics.mean(adds) * 1e6, 1),
        "updates": len(updates),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--notes", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6391/7", help="a DB it flushes")
    args = p.parse_args(argv)
    if Redis.from_url(args.redis_url).connection_pool.connection_kwargs.get("db", 0) == 0:
        p.error("give a --redis-url with a DB other than 0: the bench flushes it")
    with Redis.from_url(args.redis_url) as r:
        r.flushdb()
    try:
        out = {"notes": args.notes, **follow(args.redis_url, args.notes, args.repeats)}
    finally:
        with Redis.from_url(args.redis_url) as r:
            r.flushdb()
    out.update(lexical_updates(args.notes))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
