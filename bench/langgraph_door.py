"""The LangGraph door's cost: ``ZettelqStore.put`` against the direct ``MemoryClient.store`` in
the same run, and ``ZettelqStore.batch`` of N puts against ``store_many`` of N notes.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/langgraph_door.py`` (about a
minute). It uses the Redis that ``--redis`` names (default ``redis://127.0.0.1:6379/6``) under a
key prefix of its own and deletes that prefix's keys at the end. No worker runs: both paths
only queue their jobs (that is all a put or a store does), so this is pure producer cost.

The two paths store the same text with the same metadata size: the direct call stores
``text`` with ``metadata={"content": text}``, the put stores ``{"content": text}`` (indexed as
a whole, the default), which the store keeps in the note's metadata. Series alternate between
the two paths in rounds so that drift in the machine's load hits both alike.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import uuid
from collections.abc import Callable

from langgraph.store.base import PutOp
from redis import Redis

from producer import MemoryClient, ProducerSettings
from producer.adapters.langgraph import ZettelqStore
from producer.adapters.langgraph.mapping import encode_namespace

log = logging.getLogger("bench.langgraph_door")

NAMESPACE = ("bench", "langgraph")  #: the LangGraph namespace every put goes to
TEXT = (
    "The customer's Snowflake account uses key-pair auth with Azure AD; rotation happens every "
    "90 days and the reporting warehouse is sized X-Small for now."
)  #: about 150 bytes, like an agent's memory
WARMUP_CALLS = 200  #: untimed calls of each path before the series


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(call: Callable[[int], object], start: int, n: int) -> list[float]:
    """Seconds per call of ``call(i)`` for i in start..start+n."""
    out = []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        call(i)
        out.append(time.perf_counter() - t0)
    return out


def latency(client: MemoryClient, store: ZettelqStore, rounds: int, calls: int) -> None:
    ns = encode_namespace(NAMESPACE)

    def direct(i: int) -> object:
        return client.store(TEXT, namespace=ns, id=f"d{i}", metadata={"content": TEXT})

    def put(i: int) -> object:
        store.put(NAMESPACE, f"k{i}", {"content": TEXT})
        return None

    timed(direct, -WARMUP_CALLS, WARMUP_CALLS)
    timed(put, -WARMUP_CALLS, WARMUP_CALLS)
    series: dict[str, list[float]] = {"MemoryClient.store": [], "ZettelqStore.put": []}
    for r in range(rounds):
        order = [("MemoryClient.store", direct), ("ZettelqStore.put", put)]
        for name, call in order if r % 2 == 0 else order[::-1]:
            series[name] += timed(call, r * calls, calls)
    base = statistics.median(series["MemoryClient.store"])
    log.info("latency, %d rounds x %d calls per path (µs):", rounds, calls)
    for name, samples in series.items():
        p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
        log.info(
            "  %-20s p50 %7.1f  p99 %7.1f  p50 ratio %4.2f  p50 overhead %+6.1f",
            name,
            p50 * 1e6,
            p99 * 1e6,
            p50 / base,
            (p50 - base) * 1e6,
        )


def batches(client: MemoryClient, store: ZettelqStore, rounds: int, size: int) -> None:
    ns = encode_namespace(NAMESPACE)
    items = [{"content": TEXT, "metadata": {"content": TEXT}} for _ in range(size)]

    def direct(i: int) -> object:
        return client.store_many(items, namespace=ns)

    def batch(i: int) -> object:
        return store.batch([PutOp(NAMESPACE, f"b{i}-{j}", {"content": TEXT}) for j in range(size)])

    series: dict[str, list[float]] = {"store_many": [], "ZettelqStore.batch": []}
    for r in range(rounds):
        series["store_many"] += timed(direct, r, 1)
        series["ZettelqStore.batch"] += timed(batch, r, 1)
    log.info("batches of %d, %d each (notes/s from the median batch):", size, rounds)
    for name, samples in series.items():
        med = statistics.median(samples)
        log.info("  %-20s median %6.2f ms  %9.0f notes/s", name, med * 1e3, size / med)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/6")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=500, help="calls per path per round")
    parser.add_argument("--batch", type=int, default=100, help="puts per batch")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.info("cpus=%d load=%s %s", os.cpu_count() or 0, os.getloadavg(), vars(args))
    prefix = f"bench-lg-{uuid.uuid4().hex[:8]}"
    settings = ProducerSettings(redis_url=args.redis, key_prefix=prefix)
    try:
        with MemoryClient(settings) as client:
            store = ZettelqStore(client)
            latency(client, store, args.rounds, args.calls)
            batches(client, store, args.rounds * 3, args.batch)
            store.close()
    finally:
        redis = Redis.from_url(args.redis)
        for key in redis.scan_iter(match=f"{prefix}:*", count=1_000):
            redis.delete(key)
        redis.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
