"""Ingest in one process: what a note costs the worker's CPU and Redis's, and a dump of what the
ingest stored, to compare two trees' ingests of the same seeded corpus.

Run from the tree to measure (``PYTHONPATH=<tree>``; the script needs only stable APIs, so one
copy of it serves both trees), on a Redis DB of your own that it flushes::

    PYTHONPATH=. .venv/bin/python bench/ingest_check.py --notes 5000 \\
        --redis-url redis://127.0.0.1:6393/4 --dump /tmp/head.json
    .venv/bin/python bench/ingest_check.py --compare /tmp/base.json /tmp/head.json

The corpus is ``foundation.py``'s ``Corpus(seed)`` with fixed ids, agents, sessions
(``event_time``), tags and metadata, then updates of earlier ids (half of them with new content)
and deletes, all queued before the drain starts. The drain runs ``drain_shard`` in this process
until the shard is empty; CPU seconds are this process's (``time.process_time``) and the Redis
server's (``INFO cpu``). The dump holds every note's fields (no timestamps, no inbox entry ids),
its links (neighbour -> weight, reason, label, source) and the audit entries (op, id, actor,
before, after), so ``--compare`` says whether two ingests stored the same thing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
from redis import Redis

from bench.foundation import Corpus
from producer import MemoryClient, ProducerSettings
from producer.keys import Keys
from producer.protocol import PACKED_FIELDS, link_meta, link_weight
from worker.context import WorkerContext
from worker.intake.drain import drain_shard
from worker.settings import WorkerSettings

log = logging.getLogger("bench.ingest_check")

NAMESPACE = "check"
PREFIX = "zqcheck"
SHARD_COUNT = 8
CHUNK = 500  #: notes per store_many() call
SESSION_NOTES = 20  #: notes per event_time (a session: sequence links within it)
VOLATILE = {"created_at", "updated_at", "last_access", "src"}  #: fields that differ by nature
LINK_FIELDS = ("reason", "label", "source")  #: a link's metadata compared (not its time)


def items(n: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The corpus: ``n`` new notes, then updates of earlier ids, then deletes."""
    corpus, rng = Corpus(seed), random.Random(seed)
    notes = [
        {
            "id": f"n{i:06d}",
            "content": corpus.note(),
            "agent": f"agent-{i % 3}",
            "event_time": 1.7e9 + 3600.0 * (i // SESSION_NOTES),
            "tags": [f"t{i % 7}"],
            "metadata": {"i": i},
        }
        for i in range(n)
    ]
    picked = rng.sample(range(n), max(n // 20, 1))
    updates = [
        dict(notes[i], content=corpus.note() if k % 2 else notes[i]["content"], importance=0.7)
        for k, i in enumerate(picked)
    ]
    deletes = [f"n{i:06d}" for i in rng.sample(range(n), max(n // 100, 1))]
    return notes, updates, deletes


def queue(mem: MemoryClient, n: int, seed: int) -> int:
    notes, updates, deletes = items(n, seed)
    for batch in (notes, updates):
        for i in range(0, len(batch), CHUNK):
            mem.store_many(batch[i : i + CHUNK], namespace=NAMESPACE)
    for nid in deletes:
        mem.delete(nid, namespace=NAMESPACE)
    return len(notes) + len(updates) + len(deletes)


def redis_cpu_s(r: Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(ctx: WorkerContext, shard: int) -> int:
    done = 0
    while True:
        result = drain_shard(ctx, shard, wait_ms=0)
        done += result.processed
        if not result.more:
            return done


def dump(r: Redis, keys: Keys) -> dict[str, Any]:
    """Everything the ingest stored in the namespace, without what differs by nature."""
    ids = sorted(m.decode() for m in r.zrange(keys.active(NAMESPACE), 0, -1))
    ids += sorted(m.decode() for m in r.zrange(keys.tombstoned(NAMESPACE), 0, -1))
    notes: dict[str, Any] = {}
    for nid in ids:
        raw = r.hgetall(keys.note(NAMESPACE, nid))
        fields = {k.decode(): v for k, v in raw.items() if k.decode() not in VOLATILE}
        note = {k: _decode(k, v) for k, v in sorted(fields.items())}
        links = r.hgetall(keys.links(NAMESPACE, nid))
        note["links"] = {
            nb.decode(): [link_weight(v), *(link_meta(v).get(f) for f in LINK_FIELDS)]
            for nb, v in sorted(links.items())
        }
        notes[nid] = note
    audit = [
        [_decode(f, fields[f.encode()]) for f in ("op", "id", "actor", "before", "after")]
        for _, fields in r.xrange(keys.audit(NAMESPACE))
    ]
    stats = {k.decode(): v.decode() for k, v in r.hgetall(keys.stats(NAMESPACE)).items()}
    stats = {k: v for k, v in sorted(stats.items()) if not k.startswith("last_")}
    return {"notes": notes, "audit": audit, "stats": stats}


def _decode(key: str, value: bytes) -> Any:
    if key == "vec":
        return hashlib.sha256(value).hexdigest()
    if key in PACKED_FIELDS or key in ("before", "after"):
        return msgpack.unpackb(value, raw=False)
    return value.decode()


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = WorkerSettings(
            redis_url=args.redis_url,
            key_prefix=PREFIX,
            shard_count=SHARD_COUNT,
            index_dir=Path(tmp),
            batch_wait_ms=0,
        )
        r = Redis.from_url(args.redis_url)
        r.flushdb()
        mem = MemoryClient(
            ProducerSettings(redis_url=args.redis_url, key_prefix=PREFIX, shard_count=SHARD_COUNT)
        )
        jobs = queue(mem, args.notes, args.seed)
        ctx = WorkerContext.build(settings)
        shard = ctx.keys.shard_of(NAMESPACE)
        wall, cpu, redis_cpu = time.perf_counter(), time.process_time(), redis_cpu_s(r)
        done = drain(ctx, shard)
        wall = time.perf_counter() - wall
        cpu, redis_cpu = time.process_time() - cpu, redis_cpu_s(r) - redis_cpu
        out = {
            "jobs": done,
            "wall_s": round(wall, 3),
            "jobs_per_s": round(done / wall),
            "worker_cpu_ms_per_job": round(1000 * cpu / done, 4),
            "redis_cpu_ms_per_job": round(1000 * redis_cpu / done, 4),
        }
        if done != jobs:
            raise RuntimeError(f"queued {jobs} jobs, drained {done}")
        if args.dump:
            args.dump.write_text(json.dumps(dump(r, ctx.keys), sort_keys=True))
        ctx.close()
        mem.close()
        r.flushdb()
        return out


def compare(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    differ = 0
    for part in ("notes", "stats"):
        for key in sorted(set(left[part]) | set(right[part])):
            if left[part].get(key) != right[part].get(key):
                differ += 1
                if differ <= 5:
                    print(f"{part} {key}:\n  {left[part].get(key)}\n  {right[part].get(key)}")
    same_audit = left["audit"] == right["audit"]
    links = sum(len(n["links"]) for n in left["notes"].values()) // 2
    print(
        f"notes {len(left['notes'])} / {len(right['notes'])}, links {links}, "
        f"{differ} notes or stats differ, audit {'same' if same_audit else 'DIFFERS'} "
        f"({len(left['audit'])} / {len(right['audit'])} entries)"
    )
    return 0 if differ == 0 and same_audit else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--notes", type=int, default=5_000, help="new notes (plus updates, deletes)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6393/4", help="a DB it flushes")
    p.add_argument("--dump", type=Path, help="write what was stored here (JSON)")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="compare two dumps")
    args = p.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
