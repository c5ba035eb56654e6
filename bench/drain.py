"""Drain scaling: how many notes/s 1 and 2 worker processes organise from a queued backlog.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/drain.py`` (about 4 minutes).

For each worker count, a fresh redis-server (AOF on, ``appendfsync everysec``, as
deploy/redis.conf) gets ``--namespaces`` namespaces on as many different shards, ``--notes``
notes each, queued before any worker starts (``load.py``'s texts, or ``foundation.py``'s with
``--corpus foundation``). Then ``zettelq worker`` processes are started and ``stats()`` is
polled every 0.2 s; the rate counts the notes organised between the first poll that sees one and
the poll that sees all (worker start-up excluded). CPU seconds of the worker processes and of
Redis over that span are read from /proc, with the AOF rewrites Redis ran in it (each forks a
child that writes the whole data set again, whose CPU the /proc reading misses once it exits).
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
from pathlib import Path

from redis import Redis

from bench.foundation import Corpus
from bench.load import _text, cpu_s
from producer import MemoryClient, ProducerSettings
from producer.keys import Keys
from worker.runtime.devserver import EmbeddedRedis

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


def run(workers: int, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    with EmbeddedRedis(appendonly=True, data_dir=tempfile.mkdtemp(dir=tmp)) as server:
        prefix = f"drain{workers}"
        settings = ProducerSettings(
            redis_url=server.url, key_prefix=prefix, shard_count=SHARD_COUNT, max_pending=10**8
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
                "ZQ_REDIS_URL": server.url,
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
                return measure(mem, names, args.namespaces * args.notes, procs, server)
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
    server: EmbeddedRedis,
) -> dict[str, float]:
    r = Redis.from_url(server.url)
    redis_pid = int(r.info("server")["process_id"])
    rewrites = int(r.info("persistence")["aof_rewrites"])
    first: tuple[float, int, float, float] | None = None
    while True:
        done = sum(mem.stats(ns).notes for ns in names)
        now = time.monotonic()
        workers_cpu = sum(cpu_s(p.pid) for p in procs)
        if first is None and done:
            first = (now, done, workers_cpu, cpu_s(redis_pid))
        if first is not None and done >= total:
            span = now - first[0]
            return {
                "notes/s": (done - first[1]) / span,
                "seconds": span,
                "worker cpu s": workers_cpu - first[2],
                "redis cpu s": cpu_s(redis_pid) - first[3],
                "aof rewrites": int(r.info("persistence")["aof_rewrites"]) - rewrites,
            }
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited; see the log of {server.url}")
        time.sleep(POLL_S)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--notes", type=int, default=15_000, help="notes queued per namespace")
    p.add_argument("--namespaces", type=int, default=4)
    p.add_argument("--workers", default="1,2", help="worker process counts to run, in order")
    p.add_argument("--corpus", choices=("load", "foundation"), default="load")
    args = p.parse_args()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in [int(w) for w in args.workers.split(",")]:
            row = run(workers, args, Path(tmp))
            rows.append(row)
            log.info(
                "workers=%d: %.0f notes/s over %.1f s; worker CPU %.1f s, Redis CPU %.1f s, "
                "%d AOF rewrites",
                workers,
                row["notes/s"],
                row["seconds"],
                row["worker cpu s"],
                row["redis cpu s"],
                row["aof rewrites"],
            )
    if len(rows) > 1:
        log.info("notes/s ratio: %.2f", rows[1]["notes/s"] / rows[0]["notes/s"])
    log.info("cpus=%d namespaces=%d notes each=%d", os.cpu_count(), args.namespaces, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
