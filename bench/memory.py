"""Redis memory per note: what each key of an organised namespace costs, by ``MEMORY USAGE``.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/memory.py`` (about a minute per
configuration at the default 20,000 notes). Each configuration gets a fresh redis-server of its
own (no RDB, no AOF: memory is what is measured) started with ``hash-max-listpack-value`` set to
each value of ``--listpack`` (``64`` is Redis's default), and ``foundation.py``'s seeded notes
(~200 bytes) queued with store_many, then organised by one ``zettelq worker`` with the default
settings plus ``--env`` (e.g. ``--env ZQ_VECTOR_STORAGE=float16``). Once drained, every key is
read with ``MEMORY USAGE ... SAMPLES 0`` and grouped by kind (``note``, ``links``, ``audit``, ...),
and ``INFO memory``'s used_memory is compared with the empty server's.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from bench.foundation import (
    Corpus,
    Result,
    code_version,
    loadavg,
    publish,
    queue_notes,
    start_worker,
    stop_worker,
    wait_ingested,
    worker_env,
    zq_setting,
)
from producer import MemoryClient, ProducerSettings
from producer.keys import Keys
from worker.runtime.devserver import EmbeddedRedis

log = logging.getLogger("bench.memory")

NAMESPACE = "bench"  #: the namespace every note goes to
PREFIX = "zqm"  #: the key prefix
SHARD_COUNT = 8  #: ZQ_SHARD_COUNT of producer and worker
SEED = 20_000  #: the corpus seed


@dataclass
class Usage:
    """Bytes by key kind of one configuration."""

    config: str
    notes: int
    used: int = 0  #: used_memory over the empty server's
    kinds: dict[str, tuple[int, int]] = field(default_factory=dict)  #: kind -> (keys, bytes)
    encodings: Counter[str] = field(default_factory=Counter)  #: "kind encoding" -> keys
    ingest_per_s: float = 0.0
    load: str = ""


def kind_of(key: str, keys: Keys) -> str:
    """The kind of a namespace key (``note``, ``links``, ``active``...), or the key's own name
    outside the namespace (queues, stats of the process, Celery's bindings)."""
    head = f"{keys.prefix}:{{{NAMESPACE}}}:"
    if key.startswith(head):
        return key[len(head) :].split(":", 1)[0]
    return "other"


def measure(r: Redis, keys: Keys, usage: Usage) -> None:
    sizes: dict[str, list[int]] = {}
    for raw in r.scan_iter(count=1_000):
        key = raw.decode()
        kind = kind_of(key, keys)
        sizes.setdefault(kind, []).append(int(r.memory_usage(raw, samples=0) or 0))
        if kind in ("note", "links"):
            usage.encodings[f"{kind} {r.object('encoding', raw).decode()}"] += 1
    usage.kinds = {kind: (len(b), sum(b)) for kind, b in sizes.items()}


def run(notes: int, listpack: int, env: dict[str, str]) -> Usage:
    label = f"hash-max-listpack-value {listpack}" + "".join(f", {k}={v}" for k, v in env.items())
    usage = Usage(label, notes, load=loadavg())
    extra = ["--hash-max-listpack-value", str(listpack)]
    with EmbeddedRedis(extra_args=extra) as server, Redis.from_url(server.url) as r:
        empty = int(r.info("memory")["used_memory"])
        settings = ProducerSettings(redis_url=server.url, key_prefix=PREFIX, shard_count=8)
        corpus = Corpus(seed=SEED)
        with MemoryClient(settings) as mem, tempfile.TemporaryDirectory(prefix="zqmem") as tmp:
            queue_notes(mem, [corpus.note() for _ in range(notes)])
            worker = worker_env(server.url, PREFIX, str(Path(tmp) / "index"))
            worker.update(env)
            proc = start_worker(worker, Path(tmp) / "worker.log")
            result = Result(notes)
            try:
                wait_ingested(mem, proc, notes, result)
            finally:
                stop_worker(proc)
            if result.ingested < notes:
                raise RuntimeError(f"only {result.ingested} of {notes} notes were organised")
        usage.ingest_per_s = result.ingest_per_s
        time.sleep(0.5)  # the worker's last heartbeat and stats writes
        usage.used = int(r.info("memory")["used_memory"]) - empty
        measure(r, Keys(PREFIX, SHARD_COUNT), usage)
    return usage


def table(results: Sequence[Usage]) -> str:
    kinds = sorted(
        {k for u in results for k in u.kinds},
        key=lambda k: -max(u.kinds.get(k, (0, 0))[1] for u in results),
    )
    head = "| bytes per note | " + " | ".join(u.config for u in results) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    for kind in kinds:
        cells = [f"{u.kinds.get(kind, (0, 0))[1] / u.notes:,.0f}" for u in results]
        lines.append(f"| `{kind}` | " + " | ".join(cells) + " |")
    sums = [f"{sum(b for _, b in u.kinds.values()) / u.notes:,.0f}" for u in results]
    lines.append("| sum of MEMORY USAGE | " + " | ".join(sums) + " |")
    no_audit = [
        f"{sum(b for k, (_, b) in u.kinds.items() if k != 'audit') / u.notes:,.0f}" for u in results
    ]
    lines.append("| the same without `audit` | " + " | ".join(no_audit) + " |")
    lines.append(
        "| used_memory over the empty server | "
        + " | ".join(f"{u.used / u.notes:,.0f}" for u in results)
        + " |"
    )
    lines.append(
        "| hash encodings (keys) | "
        + " | ".join(
            ", ".join(f"{k}: {n:,}" for k, n in sorted(u.encodings.items())) for u in results
        )
        + " |"
    )
    lines.append(
        "| ingest, 1 worker (notes/s) | "
        + " | ".join(f"{u.ingest_per_s:,.0f}" for u in results)
        + " |"
    )
    lines.append("| 1-min load average at start | " + " | ".join(u.load for u in results) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--notes", type=int, default=20_000, help="notes to organise")
    p.add_argument(
        "--listpack", default="64,256,2048", help="comma-separated hash-max-listpack-value values"
    )
    p.add_argument(
        "--env", action="append", default=[], type=zq_setting, help="ZQ_NAME=VALUE for the worker"
    )
    p.add_argument("--output", type=Path, help="also write the markdown here")
    args = p.parse_args(argv)
    args.listpack = [int(v) for v in args.listpack.split(",") if v.strip()]
    if args.notes < 1 or not args.listpack or min(args.listpack) < 1:
        p.error("--notes and every --listpack value must be positive")
    args.env = dict(args.env)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    head = (
        f"Run started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; code "
        f"{code_version()}; {args.notes:,} notes of ~200 bytes, the default hashing embedder (256 "
        f"dimensions).\n\n"
    )
    usages = [run(args.notes, listpack, args.env) for listpack in args.listpack]
    publish(head + table(usages), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
