"""The CrewAI door's cost: ``ZettelqStorage.save`` and ``.search`` against the direct client.

Run from the repo root in the CrewAI venv: ``.venv-crewai/bin/python bench/crewai_door.py``
(``./scripts/test-crewai`` builds it). On an embedded Redis of its own (or ``--redis-url``, whose
database is flushed before and after), in one process:

1. **save**: ``MemoryClient.store(content, metadata, tags, importance, event_time)`` against
   ``ZettelqStorage.save([record])`` of a CrewAI ``MemoryRecord`` with the same content, in
   alternating blocks of ``BLOCK`` calls so both series share the machine's load; no worker runs,
   so this is the producer cost of each. Records are built before the clock starts.
2. **search**: with ``NOTES`` records organised by the in-thread search server (the real worker
   code), ``MemoryClient.search(text, k=10)`` against ``ZettelqStorage.search(vector, limit=10)``
   of a vector ``zettelq_embedder`` made for the same text, alternating in the same way.

Each call is timed on its own; p50 and p99 are nearest rank.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from crewai.memory.types import MemoryRecord
from redis import Redis

from producer import MemoryClient
from producer.adapters.crewai import ZettelqStorage, zettelq_embedder
from worker.context import WorkerContext
from worker.runtime.devserver import EmbeddedRedis
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings

log = logging.getLogger("bench.crewai_door")

NAMESPACE = "bench-crew"  #: the direct client's namespace
DOOR_NAMESPACE = "bench-crew-door"  #: the storage's namespace
CALLS = 5_000  #: timed saves per series
SEARCHES = 1_000  #: timed searches per series
WARMUP = 200  #: untimed calls before each series
BLOCK = 100  #: calls of one series before switching to the other
NOTES = 1_000  #: records stored before the searches
WORDS = (
    "snowflake key pair auth azure rotation days launch blog tuesday budget warehouse suspend "
    "idle minutes customer account policy network endpoint region backup schedule audit review"
).split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."


def percentiles(samples_ns: Sequence[int]) -> tuple[float, float]:
    """p50 and p99 (nearest rank), in microseconds."""
    ordered = sorted(samples_ns)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return rank(0.50), rank(0.99)


def alternate(calls: dict[str, Callable[[int], object]], n: int) -> dict[str, tuple[float, float]]:
    """Each call's p50/p99 over ``n`` timed calls, run in alternating blocks after a warm-up."""
    for call in calls.values():
        for i in range(WARMUP):
            call(i)
    samples: dict[str, list[int]] = {name: [] for name in calls}
    for start in range(0, n, BLOCK):
        for name, call in calls.items():
            for i in range(start, min(start + BLOCK, n)):
                began = time.perf_counter_ns()
                call(WARMUP + i)
                samples[name].append(time.perf_counter_ns() - began)
    return {name: percentiles(s) for name, s in samples.items()}


def bench_save(client: MemoryClient, storage: ZettelqStorage) -> dict[str, tuple[float, float]]:
    rng = random.Random(7)
    total = WARMUP + CALLS
    texts = [sentence(rng) for _ in range(total)]
    records = [
        MemoryRecord(content=t, scope="/crew/research", categories=["bench"], importance=0.6)
        for t in texts
    ]

    def direct(i: int) -> object:
        return client.store(
            texts[i],
            namespace=NAMESPACE,
            metadata={"scope": "/crew/research"},
            tags=["bench"],
            importance=0.6,
            event_time=datetime.now(),
        )

    def door(i: int) -> object:
        storage.save([records[i]])
        return None

    return alternate({"client.store": direct, "ZettelqStorage.save": door}, CALLS)


def bench_search(client: MemoryClient, storage: ZettelqStorage) -> dict[str, tuple[float, float]]:
    rng = random.Random(11)
    embed = zettelq_embedder(client, DOOR_NAMESPACE)
    texts = [sentence(rng) for _ in range(NOTES)]
    for start in range(0, NOTES, 500):
        chunk = texts[start : start + 500]
        client.store_many(chunk, namespace=NAMESPACE)
        storage.save([MemoryRecord(content=t, scope="/crew/research") for t in chunk])
    client.flush(NAMESPACE)
    client.flush(DOOR_NAMESPACE)
    queries = [" ".join(rng.sample(WORDS, 3)) for _ in range(WARMUP + SEARCHES)]
    vectors = embed(queries)

    def direct(i: int) -> object:
        return client.search(queries[i], namespace=NAMESPACE, k=10)

    def door(i: int) -> object:
        return storage.search(vectors[i], limit=10)

    return alternate({"client.search": direct, "ZettelqStorage.search": door}, SEARCHES)


def run(redis_url: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = WorkerSettings(
            redis_url=redis_url, key_prefix=f"b{uuid.uuid4().hex[:6]}", index_dir=Path(tmp)
        )
        ctx = WorkerContext.build(settings)
        server = SearchServer(ctx).start()
        try:
            with MemoryClient(settings) as client:
                storage = ZettelqStorage(client, DOOR_NAMESPACE)
                log.info("save: %d calls per series", CALLS)
                rows = bench_save(client, storage)
                Redis.from_url(redis_url).flushdb()
                log.info("search: %d records, %d searches per series", NOTES, SEARCHES)
                rows |= bench_search(client, storage)
                storage.close()
        finally:
            server.stop()
            ctx.close()
    return table(rows)


def table(rows: dict[str, tuple[float, float]]) -> list[str]:
    lines = ["| call | p50 µs | p99 µs | p50 vs the client |", "|---|---|---|---|"]
    for name, (p50, p99) in rows.items():
        base = rows["client.search" if "search" in name else "client.store"][0]
        lines.append(f"| `{name}` | {p50:.0f} | {p99:.0f} | {p50 / base:.2f}x |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="a Redis whose database is flushed (default: own)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    log.info("load average %s", os.getloadavg())
    if args.redis_url:
        Redis.from_url(args.redis_url).flushdb()
        lines = run(args.redis_url)
        Redis.from_url(args.redis_url).flushdb()
    else:
        with EmbeddedRedis() as server:
            lines = run(server.url)
    log.info("load average %s", os.getloadavg())
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
