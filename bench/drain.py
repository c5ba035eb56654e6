"""Drain scaling: how many notes/s 1, 2 (or more) worker processes organise from a queued
backlog, and the CPU each organised note costs the workers and Redis.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/drain.py`` (about 4 minutes);
``--workers 1,2,4`` for more counts, ``--cluster`` for the data on a throwaway 3-master Redis
Cluster (redis-server and redis-cli on PATH; AOF on each node, the broker a separate server).

For each worker count, a fresh redis-server (AOF on, ``appendfsync everysec``, as
deploy/redis.conf) gets ``--namespaces`` namespaces on as many different shards, ``--notes``
notes each, queued before any worker starts (``load.py``'s texts, or ``foundation.py``'s with
``--corpus foundation``). Then ``zettelq worker`` processes are started and ``stats()`` is
polled every 0.2 s; the rate counts the notes organised between the first poll that sees one and
the poll that sees all (worker start-up excluded). CPU seconds of the worker processes and of
Redis (every node of a cluster) over that span are read from /proc and divided by the notes
organised in it, with the AOF rewrites Redis ran in it (each forks a child that writes the whole
data set again, whose CPU the /proc reading misses once it exits).
Unlike ``load.py``, no producer or search competes with the workers for the host's cores, so this
isolates how organisation itself scales out.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from redis import Redis

from bench.foundation import Corpus, cpu_s
from bench.load import _text
from producer import MemoryClient, ProducerSettings
from producer.keys import Keys
from worker.runtime.devserver import EmbeddedRedis, ThrowawayCluster

log = logging.getLogger("bench.drain")

SHARD_COUNT = 8  #: ZQ_SHARD_COUNT of producer and workers
CHUNK = 500  #: notes per store_many() call
POLL_S = 0.2  #: stats() polling interval


def namespaces(prefix: str, count: int) -> list[str]:
    """``count`` namespaces, each on its own shard."""
    keys, i = Keys(prefix, SHARD_COUNT), 0
    names: list[str] = []
    shards: set[int] = set()
    while len(names) < count:
        ns, i = f"tenant-{i}", i + 1
        if keys.shard_of(ns) not in shards:
            shards.add(keys.shard_of(ns))
            names.append(ns)
    return names


@contextmanager
def data_store(args: argparse.Namespace, tmp: Path) -> Iterator[tuple[str, str, list[Redis]]]:
    """(data URL, broker URL, a client of each data server): one AOF ``everysec`` redis-server
    that is its own broker, or with ``--cluster`` a throwaway 3-master cluster (AOF on each
    node) and a separate broker."""
    if not args.cluster:
        with EmbeddedRedis(appendonly=True, data_dir=tempfile.mkdtemp(dir=tmp)) as server:
            yield server.url, server.url, [Redis.from_url(server.url)]
        return
    with (
        ThrowawayCluster(Path(tempfile.mkdtemp(dir=tmp)), appendonly=True) as cluster,
        EmbeddedRedis(data_dir=tempfile.mkdtemp(dir=tmp)) as broker,
    ):
        yield cluster.url, broker.url, [cluster.node(port) for port in cluster.ports]


def run(workers: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    with data_store(args, tmp) as (url, broker, nodes):
        prefix = f"drain{workers}"
        settings = ProducerSettings(
            redis_url=url, key_prefix=prefix, shard_count=SHARD_COUNT, max_pending=10**8
        )
        names = namespaces(prefix, args.namespaces)
        rng, corpus = random.Random(1), Corpus(11)
        with MemoryClient(settings) as mem:
            for ns in names:
                if args.corpus == "foundation":
                    texts = [corpus.note() for _ in range(args.notes)]
                else:
                    texts = [_text(rng.randrange(10**8)) for _ in range(args.notes)]
                for start in range(0, len(texts), CHUNK):
                    mem.store_many(texts[start : start + CHUNK], namespace=ns)
            env = {
                **os.environ,
                "ZQ_REDIS_URL": url,
                "ZQ_BROKER_URL": broker,
                "ZQ_KEY_PREFIX": prefix,
                "ZQ_SHARD_COUNT": str(SHARD_COUNT),
                "ZQ_INDEX_DIR": str(tmp / f"index{workers}"),
            }
            command = [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"]
            procs = [
                subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
                for _ in range(workers)
            ]
            try:
                return measure(mem, names, args.namespaces * args.notes, procs, nodes)
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    proc.wait(30)


def measure(
    mem: MemoryClient,
    names: list[str],
    total: int,
    procs: list[subprocess.Popen[bytes]],
    nodes: list[Redis],
) -> dict[str, Any]:
    redis_pids = [int(r.info("server")["process_id"]) for r in nodes]
    rewrites = sum(int(r.info("persistence")["aof_rewrites"]) for r in nodes)
    first: tuple[float, int, float, float] | None = None
    finished: dict[str, float] = {}
    while True:
        counts = {ns: mem.stats(ns).notes for ns in names}
        done = sum(counts.values())
        now = time.monotonic()
        workers_cpu = sum(cpu_s(p.pid) for p in procs)
        redis_cpu = sum(cpu_s(pid) for pid in redis_pids)
        if first is None and done:
            first = (now, done, workers_cpu, redis_cpu)
        if first is not None:
            for ns, count in counts.items():
                if count >= total // len(names):
                    finished.setdefault(ns, now - first[0])
        if first is not None and done >= total:
            span, notes = now - first[0], done - first[1]
            return {
                "notes/s": notes / span,
                "seconds": span,
                "worker cpu s": workers_cpu - first[2],
                "redis cpu s": redis_cpu - first[3],
                "worker cpu ms/note": 1000 * (workers_cpu - first[2]) / notes,
                "redis cpu ms/note": 1000 * (redis_cpu - first[3]) / notes,
                "aof rewrites": sum(int(r.info("persistence")["aof_rewrites"]) for r in nodes)
                - rewrites,
                "finished": sorted(finished.values()),
            }
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a worker exited")
        time.sleep(POLL_S)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--notes", type=int, default=15_000, help="notes queued per namespace")
    p.add_argument("--namespaces", type=int, default=4)
    p.add_argument("--workers", default="1,2", help="worker process counts to run, in order")
    p.add_argument("--corpus", choices=("load", "foundation"), default="load")
    p.add_argument(
        "--cluster", action="store_true", help="the data on a throwaway 3-master Redis Cluster"
    )
    args = p.parse_args()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in [int(w) for w in args.workers.split(",")]:
            row = run(workers, args, Path(tmp))
            rows.append(row)
            log.info(
                "workers=%d: %.0f notes/s over %.1f s (%.2fx one worker); worker CPU %.1f s "
                "(%.3f ms/note), Redis CPU %.1f s (%.3f ms/note), %d AOF rewrites",
                workers,
                row["notes/s"],
                row["seconds"],
                row["notes/s"] / rows[0]["notes/s"],
                row["worker cpu s"],
                row["worker cpu ms/note"],
                row["redis cpu s"],
                row["redis cpu ms/note"],
                row["aof rewrites"],
            )
            log.info(
                "  namespaces drained at %s s",
                ", ".join(f"{at:.1f}" for at in row["finished"]),
            )
    log.info("cpus=%d namespaces=%d notes each=%d", os.cpu_count(), args.namespaces, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
