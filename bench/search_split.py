"""Where a search round trip goes: the client's time against the search server's own.

One namespace of N notes (bench/foundation.py's seeded corpus) is organised in a server process
of this script's own, which then serves searches with the real search server
(``worker.runtime.servers.SearchServer``, one thread) and times, per search, the handler
(``retrieve.handle``: freshness, candidates, ranking), the reply (``servers.answer``: the reply
and the reinforcement, one pipeline) and both together from taking the job (``took``). This
process is the client: ``--warmup`` searches, then ``--searches`` timed ones, each of new
queries (so the rows a server keeps are warm only where queries share notes), then the same
timed queries again. The server also counts its garbage collections and their time by
generation. A private Redis is flushed before and after (its DB is given by ``--redis-url``;
DB 0 is refused).

    PYTHONPATH=. .venv/bin/python bench/search_split.py --notes 1000 --redis-url redis://127.0.0.1:6391/4
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis import Redis

from bench.foundation import Corpus
from producer import MemoryClient
from producer.settings import ProducerSettings

log = logging.getLogger("search_split")
NAMESPACE = "bench"
SHARDS = 8


def p50_ms(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] * 1000 if ordered else 0.0


def p99_ms(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000 if ordered else 0.0


class GcTimer:
    """A ``gc.callbacks`` entry: collections and their seconds by generation."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.runs[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._started


def serve(notes: int, url: str, prefix: str) -> None:
    """The server process: organise the notes, serve searches until SIGTERM, print timings."""
    from worker.context import WorkerContext
    from worker.intake.drain import drain_shard
    from worker.runtime import servers
    from worker.search import retrieve
    from worker.settings import WorkerSettings

    s = WorkerSettings(
        redis_url=url,
        key_prefix=prefix,
        shard_count=SHARDS,
        index_dir=Path(tempfile.mkdtemp()),
        batch_wait_ms=0,
    )
    corpus = Corpus(7)
    with MemoryClient(s) as mem:
        texts = [corpus.note() for _ in range(notes)]
        for start in range(0, notes, 500):
            mem.store_many(texts[start : start + 500], namespace=NAMESPACE)
    ctx = WorkerContext.build(s)
    while sum(drain_shard(ctx, shard).processed for shard in range(SHARDS)):
        pass
    times: dict[str, list[float]] = {"handle": [], "answer": []}

    def timed(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return real(*args)
            finally:
                times[name].append(time.perf_counter() - started)

        return call

    setattr(retrieve, "handle", timed("handle", retrieve.handle))  # noqa: B010
    if hasattr(servers, "answer"):  # trees before 2026-12-07 reply inside serve_once
        setattr(servers, "answer", timed("answer", servers.answer))  # noqa: B010
    server = servers.SearchServer(ctx).start()
    collections = GcTimer()
    gc.callbacks.append(collections)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop()
    took = [seconds for _, seconds in server.latencies._seen]
    for name, samples in {**times, "took": took}.items():
        print(f"{name} {p50_ms(samples):.3f}", flush=True)
    for gen, (runs, seconds) in enumerate(zip(collections.runs, collections.seconds, strict=True)):
        print(f"gc{gen} {runs}/{seconds * 1000:.0f}", flush=True)
    ctx.close()


def client(args: argparse.Namespace) -> None:
    prefix = f"ss{uuid.uuid4().hex[:6]}"
    command = [
        sys.executable,
        "-m",
        "bench.search_split",
        "--serve",
        "--notes",
        str(args.notes),
        "--prefix",
        prefix,
    ]
    command += ["--redis-url", args.redis_url]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        settings = ProducerSettings(redis_url=args.redis_url, key_prefix=prefix, shard_count=SHARDS)
        corpus = Corpus(9)
        queries = [corpus.query() for _ in range(args.warmup + args.searches)]
        with MemoryClient(settings) as mem:
            for query in queries[: args.warmup]:
                mem.search(query, namespace=NAMESPACE, k=10)
            rounds = []
            for _ in range(2):
                samples = []
                for query in queries[args.warmup :]:
                    started = time.perf_counter()
                    mem.search(query, namespace=NAMESPACE, k=10)
                    samples.append(time.perf_counter() - started)
                rounds.append(samples)
        with Redis.from_url(args.redis_url) as r:
            raw = []
            for _ in range(2000):
                started = time.perf_counter()
                r.lpush(f"{prefix}:raw", b"x" * 300)
                raw.append(time.perf_counter() - started)
            r.delete(f"{prefix}:raw")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    server = dict(line.split() for line in out.splitlines() if line.strip())
    print(
        f"notes={args.notes} raw LPUSH p50 {p50_ms(raw):.3f} ms | client p50/p99 "
        f"{p50_ms(rounds[0]):.3f}/{p99_ms(rounds[0]):.3f} ms, again {p50_ms(rounds[1]):.3f}/"
        f"{p99_ms(rounds[1]):.3f} ms | server p50 (both rounds): handle {server['handle']} ms, "
        f"answer {server.get('answer', '-')} ms, took {server['took']} ms | garbage "
        f"collections/ms by generation: {server['gc0']}, {server['gc1']}, {server['gc2']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notes", type=int, default=1000)
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.redis_url.rstrip("/").endswith("/0"):
        parser.error("give a DB other than 0: the script flushes it")
    logging.basicConfig(level=logging.WARNING)
    if args.serve:
        serve(args.notes, args.redis_url, args.prefix)
        return
    with Redis.from_url(args.redis_url) as r:
        r.flushdb()
    try:
        client(args)
    finally:
        with Redis.from_url(args.redis_url) as r:
            r.flushdb()


if __name__ == "__main__":
    main()
