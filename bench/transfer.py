"""Export and import throughput (``zettelq export`` / ``zettelq import``, docs/transfer.md).

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/transfer.py --notes 100000``.

In one process on a private redis-server without persistence (one shard, the default offline
embedder, ``ZQ_BATCH_WAIT_MS=0``), as a worker would run it but without Celery:

1. baseline: the direct client queues ``--notes`` ``load.py`` texts with ``store_many()`` and a
   ``drain_shard`` loop organises them (embed, judge links, commit): notes/s end to end;
2. export: ``write_export`` of that namespace to a file: notes/s and MB;
3. import of that export into a second namespace: queueing (``import_stream``) plus the drain
   loop that restores the notes (embed, write as exported): notes/s end to end;
4. import of the same texts as plain lines (store jobs, organised as in 1; ``--no-text`` skips
   it).

Each import rate is also given as a ratio to the baseline of the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
from pathlib import Path

from bench.load import _text
from producer import MemoryClient
from worker.context import WorkerContext
from worker.intake.drain import drain_shard
from worker.runtime.devserver import EmbeddedRedis
from worker.settings import WorkerSettings
from worker.transfer.export import write_export
from worker.transfer.importer import import_stream

log = logging.getLogger("bench.transfer")

CHUNK = 500  #: notes per store_many() call


def drain(ctx: WorkerContext) -> None:
    """Organise everything queued, as a worker would."""
    while drain_shard(ctx, 0).more:
        pass


def timed_import(ctx: WorkerContext, ns: str, path: Path, fmt: str) -> tuple[float, float]:
    """Seconds to queue the file, and to queue and organise it."""
    started = time.perf_counter()
    with path.open("rb") as stream:
        summary = import_stream(ctx.settings, ns, stream, fmt=fmt)
    queued = time.perf_counter() - started
    drain(ctx)
    assert summary.imported == ctx.redis.zcard(ctx.keys.active(ns)), summary
    return queued, time.perf_counter() - started


def run(notes: int, tmp: Path, text: bool = True) -> dict[str, float]:
    texts = [_text(random.Random(1).randrange(10**8) + i) for i in range(notes)]
    with EmbeddedRedis() as server:
        settings = WorkerSettings(
            redis_url=server.url,
            key_prefix="bench",
            shard_count=1,
            index_dir=tmp / "index",
            batch_wait_ms=0,
            max_pending=10**8,
        )
        ctx = WorkerContext.build(settings)
        try:
            started = time.perf_counter()
            with MemoryClient(settings) as mem:
                for start in range(0, notes, CHUNK):
                    mem.store_many(texts[start : start + CHUNK], namespace="src")
            drain(ctx)
            baseline_s = time.perf_counter() - started

            dump = tmp / "src.jsonl"
            started = time.perf_counter()
            with dump.open("w", encoding="utf-8") as out:
                write_export(ctx.redis, ctx.keys, "src", out)
            export_s = time.perf_counter() - started

            restore_queue_s, restore_s = timed_import(ctx, "dst", dump, "zettelq")
            if text:
                plain = tmp / "texts.txt"
                plain.write_text("".join(t + "\n" for t in texts))
                text_queue_s, text_s = timed_import(ctx, "txt", plain, "text")
        finally:
            ctx.close()
    result = {
        "notes": notes,
        "baseline_notes_per_s": notes / baseline_s,
        "export_notes_per_s": notes / export_s,
        "export_mb": dump.stat().st_size / 1e6,
        "restore_queue_notes_per_s": notes / restore_queue_s,
        "restore_notes_per_s": notes / restore_s,
        "restore_ratio": baseline_s / restore_s,
    }
    if text:
        result["text_queue_notes_per_s"] = notes / text_queue_s
        result["text_notes_per_s"] = notes / text_s
        result["text_ratio"] = baseline_s / text_s
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notes", type=int, default=100_000)
    parser.add_argument("--no-text", action="store_true", help="skip step 4 (plain-text import)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.notes, Path(tmp), text=not args.no_text)
    print(json.dumps({k: round(v, 2) for k, v in result.items()}))


if __name__ == "__main__":
    main()
