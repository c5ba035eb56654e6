"""Million-note benchmark: one namespace grown to 1,000,000 notes by one worker process, with
search latency, memory, recall of the approximate index, restart and deletion measured on the way.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/million.py`` (default sizes
10,000, 100,000 and 1,000,000: 30 to 40 minutes on the 2-core host, ingest about 20 of them, as
one worker's rate falls from ~2,000 notes/s at 10k to ~1,000 at 400k; at 1M Redis takes about
7.5 GB, the worker 5 GB and the bench 3 GB while it measures recall). The bench starts its
own redis-server (``--port``, no RDB and no AOF; ``--redis-arg`` adds arguments) so that INFO
memory is the namespace's alone, and ``zettelq worker`` processes one at a time (ZQ_MAX_NOTES=0
while the namespace grows). The workers get none of the shell's ZQ_ variables: ``--worker-env
ZQ_NAME=VALUE`` sets one, e.g. ``--sizes 3000,12000,30000 --worker-env ZQ_ANN_THRESHOLD=2000
--snapshot-every-s 10`` for a one-minute run whose index turns approximate at 2,000 notes.

1. Ingest: seeded ``foundation.py`` notes (``--corpus words``, random words, whose vectors are
   near-uniform; ``--corpus topics``, its ``TopicalCorpus``, notes that each keep to one of 500
   topics, whose vectors cluster as a text model's do) are queued with ``store_many()`` in chunks
   of 500, keeping the inbox backlog under ``BACKLOG_MAX`` so queued jobs do not count as note
   memory. At each checkpoint size, once drained: organised notes/s over the stretch, the worker
   tree's peak RSS, Redis ``used_memory`` per note (above the empty server), search p50/p99
   (k=10, fresh=True; the default channels and the dense channel alone) with a raw LPUSH p50
   measured at the same moment as their base, and 0 lost / 0 duplicated: the active zset holds
   exactly the returned ids, the seq counter gave out one seq per note, the inbox and the
   dead-letter stream are empty. With ``--trim-audit`` the audit stream is first trimmed to the
   workers' ``ZQ_AUDIT_MAX`` entries, as the periodic ``audit`` job of a deployment with beat
   does. Redis memory per key kind: MEMORY USAGE (SAMPLES 0) of ``MEMORY_SAMPLE`` random note and
   links hashes and of every other key, with the encodings of the sampled hashes. The searches
   wait for the worker's snapshot at the change log's tail (a save's copy holds the index for a
   moment).
2. Recall: the worker saves its snapshots every ``--snapshot-every-s`` and as it stops; the
   bench waits for one at the change log's tail, then stops it; the snapshot is loaded with
   ``VectorIndex.load`` and its top-10 for ``RECALL_QUERIES`` corpus queries (the default hashing
   embedder) compared with an exact ``IndexFlatIP`` over the vectors read from Redis.
3. Restart: a worker started with the snapshot (warm) and one with the snapshot directory emptied
   (cold rebuild), each timed from process start to its first answered search, and their answers
   to ``RESTART_QUERIES`` queries compared with the first worker's (dense ties may reorder).
4. Delete: ``DELETES`` random notes deleted through the client; none may be found by a search for
   its own content, and the active count falls by exactly that many. Evict: a worker restarted
   with ZQ_MAX_NOTES below the count runs ``organise(jobs=["evict"])``; the count must fall to
   the cap and no evicted note be found again. The snapshots after each are loaded to check that
   the approximate index itself dropped those notes.

Progress is logged every ``PROGRESS_S``; ``--output FILE`` also writes the markdown report. The
parts are in bench/scale/ (the constants in bench/scale/state.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from redis import Redis

from bench.foundation import (
    SHARD_COUNT,
    RssSampler,
    code_version,
    corpus_of,
    loadavg,
)
from bench.scale.growth import Watch, ingest_to, measure_checkpoint
from bench.scale.index import answers, evict_some, measure_recall, restart_and_delete, wait_snapshot
from bench.scale.report import report
from bench.scale.state import (
    DELETES,
    PREFIX,
    RECALL_QUERIES,
    REDIS_CONFIG,
    RESTART_QUERIES,
    Run,
    Snapshot,
    env_of,
    first_answer,
    settings_of,
    used_memory,
    worker,
)
from producer import MemoryClient, ProducerSettings
from worker.context import WorkerContext
from worker.runtime.devserver import EmbeddedRedis

log = logging.getLogger(__name__)


def ingest(
    run: Run, ctx: WorkerContext, queries: list[str]
) -> tuple[dict[str, list[list[str]]], Snapshot]:
    """Grow the namespace through every checkpoint; the restart queries' answers at the end and
    the snapshot saved then."""
    with worker(run, "ingest") as proc:
        sampler = RssSampler(proc.pid).start()
        try:
            first_answer(run, time.monotonic())
            watch = Watch(run, proc, sampler)
            for n in run.args.sizes:
                cp = ingest_to(run, n, watch)
                cp.snapshot = wait_snapshot(run, ctx, proc)  # so that no save stalls the searches
                measure_checkpoint(run, ctx, cp, sampler)
                run.checkpoints.append(cp)
            before = answers(run, queries)
            saved = wait_snapshot(run, ctx, proc)  # at once: searches leave the change log be
        finally:
            sampler.stop()
    return before, saved


@contextmanager
def phase(run: Run, name: str) -> Iterator[None]:
    """Run one phase after the ingest; a failure is a failed check, and the next phase runs."""
    try:
        yield
    except Exception as exc:
        log.exception("%s failed", name)
        run.check(f"{name} ran to its end", False, f"{type(exc).__name__}: {exc}")


def bench(run: Run) -> None:
    ctx = WorkerContext.build(settings_of(env_of(run)))
    corpus = corpus_of(run.args.corpus, 3)
    queries = [corpus.query() for _ in range(RESTART_QUERIES)]
    before, saved = ingest(run, ctx, queries)
    with phase(run, "recall"):
        measure_recall(run, ctx, saved.path)
    deleted: set[int] = set()
    with phase(run, "restart and delete"):
        deleted = restart_and_delete(run, ctx, queries, before)
    with phase(run, "eviction"):
        evict_some(run, ctx, deleted)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated checkpoints")
    p.add_argument("--port", type=int, default=6396, help="port of the bench's own redis-server")
    p.add_argument(
        "--redis-arg", action="append", default=[], help="extra redis-server argument (repeat)"
    )
    p.add_argument(
        "--worker-env", action="append", default=[], help="KEY=VALUE for the workers (repeat)"
    )
    p.add_argument("--snapshot-every-s", type=float, default=60.0, help="the workers' interval")
    p.add_argument(
        "--trim-audit",
        action="store_true",
        help="trim the audit stream to the workers' ZQ_AUDIT_MAX before each memory reading",
    )
    p.add_argument(
        "--corpus",
        choices=("words", "topics"),
        default="words",
        help="foundation.py's notes of random words, or its TopicalCorpus (notes on topics)",
    )
    p.add_argument("--output", type=Path, help="also write the markdown here")
    p.add_argument("--logs", type=Path, help="copy the workers' logs into this folder")
    args = p.parse_args(argv)
    args.sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip())
    if not args.sizes or args.sizes[0] < max(RECALL_QUERIES, DELETES * 3):
        p.error(f"sizes must be at least {max(RECALL_QUERIES, DELETES * 3):,}")
    if any("=" not in item or not item.startswith("ZQ_") for item in args.worker_env):
        p.error("--worker-env takes ZQ_NAME=VALUE")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    args = parse_args(argv)
    started, t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.monotonic()
    facts = {
        "code": code_version(),
        "load start": loadavg(),
        "cpus": str(len(os.sched_getaffinity(0))),
    }
    with (
        tempfile.TemporaryDirectory(prefix="zqmillion") as tmp,
        EmbeddedRedis(args.port, extra_args=args.redis_arg) as server,
        Redis.from_url(server.url) as r,
    ):
        info = {"redis_version": str(r.info("server")["redis_version"])}
        info.update({k: str(v) for k, v in r.config_get("*").items() if k in REDIS_CONFIG})
        settings = ProducerSettings(
            redis_url=server.url, key_prefix=PREFIX, shard_count=SHARD_COUNT
        )
        with MemoryClient(settings) as mem:
            run = Run(args, r, mem, server.url, Path(tmp), facts=facts)
            run.corpus = corpus_of(args.corpus, 1_000_003)
            run.queries = corpus_of(args.corpus, 2_000_003)
            run.base_memory = used_memory(r)
            log.info("redis-server pid on port %d: %s; code %s", args.port, info, facts["code"])
            try:
                bench(run)
            finally:
                facts["took"] = f"{(time.monotonic() - t0) / 60:.1f} min"
                if run.checkpoints:
                    markdown = report(run, started, info)
                    sys.stdout.write("\n" + markdown)
                    if args.output:
                        args.output.write_text(markdown)
    return 0 if all(ok is not False for _, ok, _ in run.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
