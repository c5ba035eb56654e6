"""Search latency while one worker process ingests flat out, against the same search idle.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/under_ingest.py`` (about 9
minutes for the default 2 rounds of 3 deployments). For each deployment, on a dedicated Redis
DB (flushed before each) under a fresh key prefix, with bench/foundation.py's corpus,
one namespace and ``ZQ_SHARD_COUNT=8``:

1. ``--seed-notes`` notes are stored and organised; then ``--idle`` timed searches (after 100
   untimed ones), ``fresh=False``, k=10: the idle p50 / p99;
2. ``--notes`` more are queued at once, and searches run back to back until the worker has
   organised them all: the p50 / p99 under ingest, and the ingest rate of that phase.

``fresh=False``, because a fresh search waits for the backlog queued before it by design.

Deployments, each its own processes:

- ``switch=5``: one ``zettelq worker`` with ``ZQ_SWITCH_INTERVAL_MS=5`` (Python's own switch
  interval, the behaviour before the setting existed): its pool process drains and searches;
- ``default``: the same worker at the default ``ZQ_SWITCH_INTERVAL_MS``;
- ``split``: an ingest-only worker (``ZQ_SERVE_SEARCH=false``) and a ``zettelq searcher``.

The issue's target: p99 under ingest at most 10x the idle p99.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from redis import Redis

from bench import foundation as f
from producer import MemoryClient, ProducerSettings

log = logging.getLogger("bench.under_ingest")

DEPLOYMENTS = {
    "switch=5": ({"ZQ_SWITCH_INTERVAL_MS": "5"}, False),
    "default": ({}, False),
    "split": ({"ZQ_SERVE_SEARCH": "false"}, True),
}
WARMUP = 100  #: untimed searches before the idle series
BURST = 20  #: searches between two looks at the backlog


def quantile(samples: Sequence[int], q: float) -> float:
    """Nearest-rank quantile of nanosecond samples, in ms."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def run(url: str, name: str, seed_notes: int, notes: int, idle_n: int) -> dict[str, float]:
    env_extra, split = DEPLOYMENTS[name]
    with Redis.from_url(url) as r:
        r.flushdb()
    corpus = f.Corpus(seed=seed_notes)
    prefix = f"zqui{os.getpid()}{name.replace('=', '')}"
    s = ProducerSettings(redis_url=url, key_prefix=prefix, shard_count=f.SHARD_COUNT)
    with MemoryClient(s) as mem, tempfile.TemporaryDirectory(prefix="zqui") as tmp:
        f.queue_notes(mem, [corpus.note() for _ in range(seed_notes)])
        env = {**f.worker_env(url, prefix, tmp + "/index"), **env_extra}
        searcher = None
        if split:
            senv = {**f.worker_env(url, prefix, tmp + "/searcher-index")}
            with open(Path(tmp) / "searcher.log", "wb") as sink:
                searcher = subprocess.Popen(
                    [sys.executable, "-m", "worker.cli.main", "searcher"],
                    env=senv,
                    cwd=f.ROOT,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
        proc = f.start_worker(env, Path(tmp) / "worker.log")
        try:
            f.wait_ingested(mem, proc, seed_notes, f.Result(seed_notes, load=[]))
            queries = [corpus.query() for _ in range(5_000)]
            for q in queries[:WARMUP]:
                mem.search(q, namespace=f.NAMESPACE, k=f.K, fresh=False)
            idle = []
            for q in queries[WARMUP : WARMUP + idle_n]:
                started = time.perf_counter_ns()
                mem.search(q, namespace=f.NAMESPACE, k=f.K, fresh=False)
                idle.append(time.perf_counter_ns() - started)
            f.queue_notes(mem, [corpus.note() for _ in range(notes)])
            busy: list[int] = []
            began, i = time.monotonic(), 0
            while mem.stats(f.NAMESPACE).pending:
                for _ in range(BURST):
                    started = time.perf_counter_ns()
                    mem.search(queries[i % len(queries)], namespace=f.NAMESPACE, k=f.K, fresh=False)
                    busy.append(time.perf_counter_ns() - started)
                    i += 1
            ingest_s = time.monotonic() - began
        finally:
            f.stop_worker(proc)
            if searcher is not None:
                f.stop_worker(searcher)
    result = {
        "idle_p50": quantile(idle, 0.5),
        "idle_p99": quantile(idle, 0.99),
        "busy_p50": quantile(busy, 0.5),
        "busy_p99": quantile(busy, 0.99),
        "searches": float(len(busy)),
        "ingest_per_s": notes / ingest_s,
        "load": float(f.loadavg()),
    }
    log.info("%s: %s", name, {k: round(v, 2) for k, v in result.items()})
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/12", help="flushed DB")
    p.add_argument("--seed-notes", type=int, default=2_000, help="notes organised before")
    p.add_argument("--notes", type=int, default=30_000, help="notes ingested while searching")
    p.add_argument("--idle", type=int, default=500, help="timed idle searches")
    p.add_argument("--rounds", type=int, default=2, help="times each deployment runs, in turn")
    p.add_argument("--only", default=",".join(DEPLOYMENTS), help="deployments to run")
    args = p.parse_args(argv)
    if args.redis_url.rstrip("/").endswith("/0"):
        p.error("--redis-url must name a DB other than 0: it is flushed")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    names = args.only.split(",")
    rows = [
        (name, rnd, run(args.redis_url, name, args.seed_notes, args.notes, args.idle))
        for rnd in range(1, args.rounds + 1)
        for name in names
    ]
    print(f"\nRun {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; code {f.code_version()}.\n")
    print(
        "| deployment (round) | idle p50 / p99 | under ingest p50 / p99 | p99 ratio | searches"
        " | ingest notes/s | load |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, rnd, o in rows:
        ratio = o["busy_p99"] / o["idle_p99"]
        print(
            f"| {name} ({rnd}) | {o['idle_p50']:.2f} / {o['idle_p99']:.2f} ms "
            f"| {o['busy_p50']:.2f} / {o['busy_p99']:.2f} ms | {ratio:.1f}x "
            f"| {o['searches']:,.0f} | {o['ingest_per_s']:,.0f} | {o['load']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
