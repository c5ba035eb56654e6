"""Load test: P producer processes store (and search) for a fixed time, or N stores each with
``--stores N``, against 1, then 2, ``zettelq worker`` processes on loopback; then every
acknowledged note is checked.

Run from the repo root: ``.venv/bin/python bench/load.py`` (about 6 minutes with the defaults
here: the producers store 240k-380k notes in the 20 s).
Each run gets its own redis-server (AOF on, ``appendfsync everysec``, as deploy/redis.conf)
and a fresh key prefix. Producers call ``store()`` one note at a time, round-robin over the
namespaces, while a second thread of each producer searches back to back with
``search(fresh=False)``, so the search latency is the query's, not the wait for the backlog.
After ``--seconds`` (or their ``--stores`` notes: then both worker counts organise the same
workload, where a fixed time lets the producers store more while fewer workers compete with them
for the cores) the producers stop and the workers drain what is left; "organised/s" is
every acknowledged note divided by the time from the first store until the backlog is empty,
and "drain organised/s" the backlog left at the end divided by the time the workers took to
empty it with the producers stopped (the workers' throughput without producers on the CPUs).
Each row also gives the cores the worker processes, Redis and the whole host (producers
included) used in each phase (CPU seconds from /proc over the phase's wall time) and the AOF
rewrites Redis ran during the run.

The check afterwards: each namespace's active notes are exactly the acknowledged ids, each was
created once (one ``create`` in the audit stream), and worker.store.integrity finds no invalid,
one-sided or cross-namespace link. Errors other than Backpressure are counted as failures.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from bench.foundation import cpu_s
from producer import Backpressure, MemoryClient, ProducerSettings, ZettelqError
from worker.context import WorkerContext
from worker.runtime.devserver import EmbeddedRedis
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace

log = logging.getLogger("bench.load")

WORDS = (
    "redis stream worker shard lease batch index vector link graph audit note memory agent "
    "search query deploy customer snowflake policy network cluster backup latency budget "
    "incident release schedule contract invoice meeting design review migration"
).split()


@dataclass
class ProducerResult:
    acked: dict[str, list[str]] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


def _text(rng_seed: int) -> str:
    n = len(WORDS)
    words = [WORDS[(rng_seed * 7 + i * i * 13) % n] for i in range(12)]
    return f"{' '.join(words)} item {rng_seed}"


def _search_loop(
    mem: MemoryClient, namespaces: list[str], done: threading.Event, out: ProducerResult
) -> None:
    i = 0
    while not done.is_set():
        i += 1
        started = time.perf_counter()
        try:
            mem.search(_text(i), namespace=namespaces[i % len(namespaces)], fresh=False, k=5)
            out.latencies_s.append(time.perf_counter() - started)
        except ZettelqError as exc:
            out.errors[type(exc).__name__] += 1


def produce(
    url: str, prefix: str, namespaces: list[str], seconds: float, who: int, stores: int
) -> ProducerResult:
    """One producer process: a thread storing ``stores`` notes (or, with ``stores`` 0, storing
    until ``seconds`` pass) and a thread searching until the storing ends."""
    settings = ProducerSettings(redis_url=url, key_prefix=prefix, max_pending=200_000)
    out = ProducerResult(acked={ns: [] for ns in namespaces})
    deadline = time.monotonic() + seconds
    done = threading.Event()
    with MemoryClient(settings) as mem:
        searcher = threading.Thread(target=_search_loop, args=(mem, namespaces, done, out))
        searcher.start()
        i = 0
        while i < stores if stores else time.monotonic() < deadline:
            ns = namespaces[(who + i) % len(namespaces)]
            try:
                out.acked[ns].append(mem.store(_text(who * 10_000_000 + i + 1), namespace=ns))
            except Backpressure:
                out.errors["Backpressure"] += 1
                if stores:  # a fixed workload stores every note: wait for the backlog to shrink
                    time.sleep(0.01)
                    continue
            except ZettelqError as exc:
                out.errors[type(exc).__name__] += 1
            i += 1
        done.set()
        searcher.join()
    return out


def _spawn_workers(
    settings: WorkerSettings, count: int, searchers: int
) -> list[subprocess.Popen[bytes]]:
    """``count`` Celery workers; with ``searchers`` > 0 they are ingest-only and that many
    `zettelq searcher` processes serve the searches (the role split)."""
    env = {
        **os.environ,
        "ZQ_REDIS_URL": settings.redis_url,
        "ZQ_KEY_PREFIX": settings.key_prefix,
        "ZQ_SHARD_COUNT": str(settings.shard_count),
        "ZQ_INDEX_DIR": str(settings.index_dir),
        "ZQ_SERVE_SEARCH": "false" if searchers else "true",
    }
    worker = [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"]
    searcher = [sys.executable, "-m", "worker.cli.main", "searcher"]
    commands = [worker] * count + [searcher] * searchers
    return [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for command in commands
    ]


def host_busy_s() -> float:
    """CPU seconds the whole host has spent busy (every state of /proc/stat's cpu line but
    idle and iowait), over all its cores."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu(procs: list[subprocess.Popen[bytes]], redis_pid: int) -> tuple[float, float, float]:
    """CPU seconds so far of the worker processes (with their pool processes), of Redis and of
    the whole host."""
    return sum(cpu_s(p.pid) for p in procs), cpu_s(redis_pid), host_busy_s()


def _cores(cpu: list[tuple[float, float, float]], i: int, load_s: float, drain_s: float) -> str:
    """Cores used by one side in the load phase and in the drain phase, as "x.xx / y.yy"."""
    load = (cpu[1][i] - cpu[0][i]) / load_s
    drain = (cpu[2][i] - cpu[1][i]) / drain_s if drain_s > 0 else 0.0
    return f"{load:.2f} / {drain:.2f}"


def _backlog(ctx: WorkerContext) -> int:
    return sum(int(ctx.redis.xlen(ctx.keys.inbox(s))) for s in range(ctx.keys.shard_count))


def _verify(ctx: WorkerContext, acked: dict[str, list[str]]) -> dict[str, int]:
    lost = duplicated = problems = 0
    for ns, ids in acked.items():
        stored = {m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)}
        lost += len(set(ids) - stored)
        creates = Counter(
            e[b"id"].decode()
            for _, e in ctx.redis.xrange(ctx.keys.audit(ns))
            if e[b"op"] == b"create"
        )
        duplicated += sum(n - 1 for n in creates.values() if n > 1) + len(stored - set(ids))
        problems += len(check_namespace(ctx, ns))
    return {"lost": lost, "duplicated": duplicated, "integrity_problems": problems}


def run(workers: int, args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    with EmbeddedRedis(appendonly=True, data_dir=tempfile.mkdtemp(dir=tmp)) as server:
        settings = WorkerSettings(
            redis_url=server.url, key_prefix=f"load{workers}", index_dir=tmp / f"index{workers}"
        )
        namespaces = [f"tenant-{i}" for i in range(args.namespaces)]
        procs = _spawn_workers(settings, workers, args.searchers)
        ctx = WorkerContext.build(settings)
        try:
            with MemoryClient(settings) as mem:
                mem.flush("warm-up", timeout_s=60)  # every worker is up and serving
            redis_pid = int(ctx.redis.info("server")["process_id"])
            rewrites = int(ctx.redis.info("persistence")["aof_rewrites"])
            cpu = [_cpu(procs, redis_pid)]
            started = time.monotonic()
            with mp.Pool(args.producers) as pool:
                jobs = [
                    (
                        server.url,
                        settings.key_prefix,
                        namespaces,
                        args.seconds,
                        p,
                        args.stores,
                    )
                    for p in range(args.producers)
                ]
                results = pool.starmap(produce, jobs)
            load_s = time.monotonic() - started
            cpu.append(_cpu(procs, redis_pid))
            backlog_end = _backlog(ctx)
            while _backlog(ctx):
                time.sleep(0.05)
            organised_s = time.monotonic() - started
            cpu.append(_cpu(procs, redis_pid))
            drain_s = organised_s - load_s
            acked = {ns: [i for r in results for i in r.acked[ns]] for ns in namespaces}
            stores = sum(len(v) for v in acked.values())
            lat = sorted(x for r in results for x in r.latencies_s)
            errors: Counter[str] = sum((r.errors for r in results), Counter())
            return {
                "workers": workers,
                "searchers": args.searchers,
                "stores/s": round(stores / load_s),
                "searches/s": round(len(lat) / load_s),
                "search p50 ms": round(statistics.median(lat) * 1000, 2) if lat else None,
                "search p99 ms": round(lat[int(len(lat) * 0.99)] * 1000, 2) if lat else None,
                "backlog at end": backlog_end,
                "organised/s": round(stores / organised_s),
                "drain organised/s": round(backlog_end / drain_s) if backlog_end else None,
                "stored": stores,
                "worker cores (load/drain)": _cores(cpu, 0, load_s, drain_s),
                "redis cores (load/drain)": _cores(cpu, 1, load_s, drain_s),
                "host busy cores (load/drain)": _cores(cpu, 2, load_s, drain_s),
                "aof rewrites": int(ctx.redis.info("persistence")["aof_rewrites"]) - rewrites,
                "errors": dict(errors),
                **_verify(ctx, acked),
            }
        finally:
            ctx.close()
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument(
        "--stores",
        type=int,
        default=0,
        help="notes each producer stores (a fixed workload); 0 stores for --seconds instead",
    )
    p.add_argument("--namespaces", type=int, default=4)
    p.add_argument("--workers", default="1,2", help="worker process counts to run, in order")
    p.add_argument(
        "--searchers",
        type=int,
        default=0,
        help="search-only processes; the workers are then ingest-only (ZQ_SERVE_SEARCH=false)",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="zq-load-") as tmp:
        rows = [run(int(w), args, Path(tmp)) for w in args.workers.split(",")]
    for row in rows:
        log.info("%s", row)
    if len(rows) >= 2:
        one, two = (cast(int, row["organised/s"]) for row in rows[:2])
        log.info("organised/s ratio: %.2f", two / one)
    log.info(
        "cpus=%d producers=%d seconds=%.0f stores=%d namespaces=%d",
        os.cpu_count() or 0,
        args.producers,
        args.seconds,
        args.stores,
        args.namespaces,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
