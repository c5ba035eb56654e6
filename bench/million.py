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

1. Ingest: seeded ``foundation.py`` notes are queued with ``store_many()`` in chunks of 500,
   keeping the inbox backlog under ``BACKLOG_MAX`` so queued jobs do not count as note memory.
   At each checkpoint size, once drained: organised notes/s over the stretch, the worker tree's
   peak RSS, Redis ``used_memory`` per note (above the empty server), search p50/p99 (k=10,
   fresh=True; the default channels and the dense channel alone) with a raw LPUSH p50 measured
   at the same moment as their base, and 0 lost / 0 duplicated: the active zset holds exactly the
   returned ids, ``seqs`` has one seq per note, the inbox and the dead-letter stream are empty.
   Redis memory per key kind: MEMORY USAGE (SAMPLES 0) of ``MEMORY_SAMPLE`` random note and links
   hashes and of every other key, with the encodings of the sampled hashes. The searches wait for
   the worker's snapshot at the change log's tail (a save holds the index: it would stall them).
2. Recall: the worker saves its snapshots every ``--snapshot-every-s`` (nothing is saved on
   shutdown), so the bench waits for one at the change log's tail, then stops it; the snapshot
   is loaded with ``VectorIndex.load`` and
   its top-10 for ``RECALL_QUERIES`` corpus queries (the default hashing embedder) compared with
   an exact ``IndexFlatIP`` over the vectors read from Redis.
3. Restart: a worker started with the snapshot (warm) and one with the snapshot directory emptied
   (cold rebuild), each timed from process start to its first answered search, and their answers
   to ``RESTART_QUERIES`` queries compared with the first worker's (dense ties may reorder).
4. Delete: ``DELETES`` random notes deleted through the client; none may be found by a search for
   its own content, and the active count falls by exactly that many. Evict: a worker restarted
   with ZQ_MAX_NOTES below the count runs ``organise(jobs=["evict"])``; the count must fall to
   the cap and no evicted note be found again. The snapshots after each are loaded to check that
   the approximate index itself dropped those notes.

Progress is logged every ``PROGRESS_S``; ``--output FILE`` also writes the markdown report.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import msgpack
import numpy as np
from redis import Redis

from bench.foundation import (
    SHARD_COUNT,
    Corpus,
    Latency,
    RssSampler,
    code_version,
    fmt_ms,
    loadavg,
    measure_raw,
    start_worker,
    stop_worker,
    timed,
    worker_env,
)
from producer import MemoryClient, ProducerSettings, ReplyTimeout
from worker.context import WorkerContext
from worker.index.kinds import Floats, Seqs
from worker.index.projection import snapshot_path
from worker.index.vector import VectorIndex
from worker.runtime.devserver import EmbeddedRedis
from worker.settings import WorkerSettings

log = logging.getLogger("bench.million")

NAMESPACE = "million"  #: the one namespace every note goes to
PREFIX = "zqm"  #: key prefix of everything the bench writes
K = 10  #: hits per search
CHUNK = 500  #: notes per store_many() call
BACKLOG_MAX = 50_000  #: most queued jobs in the inbox while ingesting
POLL_S = 0.2  #: stats polling interval
PROGRESS_S = 30.0  #: progress line interval
STALL_S = 180.0  #: give up when no note is organised for this long with jobs queued
SEARCHES, WARMUP = 500, 50  #: timed and untimed searches per series
RECALL_QUERIES = 1_000  #: queries of the recall measure
RESTART_QUERIES = 50  #: queries compared across restarts
DELETES = 1_000  #: notes deleted through the client
CONTROLS = 200  #: live notes searched by their own content (the check must be able to fail)
MEMORY_SAMPLE = 2_000  #: note and links hashes sampled by MEMORY USAGE
READ_CHUNK = 5_000  #: keys per pipelined round trip
SEARCH_TIMEOUT_S = 120.0  #: a search's reply timeout (a snapshot save holds the index meanwhile)
START_TIMEOUT_S = 1_200.0  #: longest wait for a restarted worker's first answer
#: longest wait for a snapshot at the change log's tail, past the snapshot interval
SNAPSHOT_TIMEOUT_S = 900.0
NPROBE_SWEEP = (8, 32, 128, 512)  #: IVF nprobe values the recall is also measured at
SWEEP_QUERIES = 200  #: the first queries of the recall measure, for the nprobe sweep
DENSE = {"dense": 1.0, "lexical": 0.0}  #: search weights of the dense channel alone
#: the searches compared and checked: the worker's default channels, and the dense one alone
MODES: tuple[tuple[str, dict[str, float]], ...] = (("default", {}), ("dense", DENSE))
P50_GOAL_MS, GROWTH_GOAL, RECALL_GOAL, WARM_GOAL_S = 3.0, 3.0, 0.95, 30.0  #: the issue's goals
#: the server settings the report quotes (EmbeddedRedis sets deploy/redis.conf's listpack value)
REDIS_CONFIG = ("save", "appendonly", "hash-max-listpack-value", "hash-max-listpack-entries")


@dataclass
class Checkpoint:
    n: int
    rate: float = 0.0  #: notes organised per second over the stretch since the last one
    stretch_s: float = 0.0
    stall_s: float = 0.0  #: longest spell with jobs queued and no note organised
    rss_mib: float = 0.0
    used_per_note: float = 0.0
    raw: Latency | None = None
    search: Latency | None = None
    dense: Latency | None = None
    integrity: list[str] = field(default_factory=list)  #: failed checks (empty: 0 lost, 0 dup)
    memory: list[tuple[str, int, float]] = field(default_factory=list)  #: kind, keys, B/note
    encodings: dict[str, Counter[str]] = field(default_factory=dict)
    load: str = ""
    snapshot: Snapshot | None = None  #: the one saved once drained, before the searches


@dataclass
class Run:
    """What one bench run holds and found; the sections of the report."""

    args: argparse.Namespace
    r: Redis
    mem: MemoryClient
    url: str
    workdir: Path
    corpus: Corpus = field(default_factory=lambda: Corpus(seed=1_000_003))
    queries: Corpus = field(default_factory=lambda: Corpus(seed=2_000_003))
    ids: list[str] = field(default_factory=list)
    base_memory: int = 0
    checkpoints: list[Checkpoint] = field(default_factory=list)
    snapshot_runs: dict[float, float] = field(default_factory=dict)  #: at -> seconds
    rates: list[tuple[int, float]] = field(default_factory=list)  #: notes, notes/s in a window
    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[tuple[str, bool | None, str]] = field(default_factory=list)  #: name, ok, value

    @property
    def index_dir(self) -> Path:
        return self.workdir / "index"

    def check(self, name: str, ok: bool | None, value: str) -> None:
        """Record a check against a goal; ``ok`` None: a measure without a goal."""
        self.checks.append((name, ok, value))
        log.info("%s: %s -> %s", name, value, verdict(ok))


def verdict(ok: bool | None) -> str:
    return "no goal: reported" if ok is None else ("PASS" if ok else "FAIL")


# --- the worker ------------------------------------------------------------------------------


def env_of(run: Run, **overrides: str) -> dict[str, str]:
    env = worker_env(run.url, PREFIX, str(run.index_dir))
    env.update({"ZQ_MAX_NOTES": "0", "ZQ_SNAPSHOT_EVERY_S": str(run.args.snapshot_every_s)})
    env["ZQ_MAX_PROJECTION_NOTES"] = str(max(run.args.sizes) + 1)
    env.update(dict(item.split("=", 1) for item in run.args.worker_env))
    env.update(overrides)
    return env


def settings_of(env: dict[str, str]) -> WorkerSettings:
    """The worker's settings as its environment gives them (ZQ_ variables only)."""
    values = {k[3:].lower(): v for k, v in env.items() if k.startswith("ZQ_") and "__" not in k}
    return WorkerSettings.model_validate(values)


@contextmanager
def worker(run: Run, name: str, **overrides: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ``zettelq worker`` process, stopped (SIGTERM) on leaving; its log in workdir."""
    path = run.workdir / f"{name}.log"
    proc = start_worker(env_of(run, **overrides), path, loglevel="INFO")
    log.info("started worker %s pid=%d", name, proc.pid)
    try:
        yield proc
    finally:
        stop_worker(proc)
        if run.args.logs:
            run.args.logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, run.args.logs / path.name)
        text = log_of(path)
        rebuilds = re.findall(r"index rebuilt kind=(\w+) from=(\w+) n=(\d+) in ([\d.]+)ms", text)
        run.facts.setdefault("rebuilds", []).extend((name, *row) for row in rebuilds)
        errors = [line for line in text.splitlines() if re.search(r"(ERROR|CRITICAL)/", line)]
        if errors:
            log.warning("worker %s logged %d errors, first: %s", name, len(errors), errors[0])
            logged = f"{name}: {len(errors)} lines, the first `{errors[0].strip()}`"
            run.facts["worker errors"] = "; ".join(
                filter(None, [run.facts.get("worker errors"), logged])
            )


def log_of(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def first_answer(run: Run, started: float) -> float:
    """Seconds from ``started`` until a search is answered (the projection opened)."""
    query = run.queries.query()
    while True:
        try:
            run.mem.search(query, namespace=NAMESPACE, k=K, timeout_s=300, reinforce=False)
            return time.monotonic() - started
        except ReplyTimeout:
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(f"no search answered in {START_TIMEOUT_S:.0f}s") from None


# --- ingest ----------------------------------------------------------------------------------


class Watch:
    """Polls the namespace while it grows: lost jobs, stalls, snapshot runs, progress lines."""

    def __init__(self, run: Run, proc: subprocess.Popen[bytes], sampler: RssSampler) -> None:
        self.run, self.proc, self.sampler = run, proc, sampler
        self.notes = self.pending = 0
        self.changed_at = time.monotonic()
        self.stall_s = 0.0
        self.restart()

    def restart(self) -> None:
        """Begin a stretch: its stall and its first progress window start now."""
        self.stall_s = 0.0
        self.logged_at, self.logged_notes = time.monotonic(), self.notes

    def poll(self) -> None:
        run, keys = self.run, self.run.mem.keys
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited with status {self.proc.returncode}")
        pipe = run.r.pipeline(transaction=False)
        pipe.zcard(keys.active(NAMESPACE))
        pipe.xlen(keys.inbox(keys.shard_of(NAMESPACE)))
        pipe.hget(keys.runs(), "snapshot")
        notes, pending, snap = pipe.execute()
        now = time.monotonic()
        if notes + pending < len(run.ids):  # inbox entries are deleted only after their commit
            raise RuntimeError(f"{len(run.ids) - notes - pending} queued jobs vanished")
        if snap:
            record = json.loads(snap)
            if record["namespaces"]:
                run.snapshot_runs[record["at"]] = record["seconds"]
        if notes != self.notes or not pending:
            self.changed_at = now
        self.stall_s = max(self.stall_s, now - self.changed_at)
        if now - self.changed_at > STALL_S:
            raise RuntimeError(f"no note organised for {STALL_S:.0f}s ({pending} queued)")
        self.notes, self.pending = notes, pending
        if now - self.logged_at >= PROGRESS_S:
            rate = (notes - self.logged_notes) / (now - self.logged_at)
            run.rates.append((notes, rate))
            self.logged_at, self.logged_notes = now, notes
            self.sampler.sample()
            log.info(
                "progress: %d organised (%.0f/s), %d queued, %d/%d sent, RSS peak %.0f MiB, "
                "Redis %.0f MiB",
                notes,
                rate,
                pending,
                len(run.ids),
                max(run.args.sizes),
                self.sampler.peak_kib / 1024,
                used_memory(run.r) / 2**20,
            )


def ingest_to(run: Run, n: int, watch: Watch) -> Checkpoint:
    """Queue notes until ``n`` were sent, wait until all are organised; time the stretch."""
    started, first = time.monotonic(), len(run.ids)
    watch.restart()
    while len(run.ids) < n:
        watch.poll()
        if watch.pending > BACKLOG_MAX - CHUNK:
            time.sleep(POLL_S)
            continue
        texts = [run.corpus.note() for _ in range(min(CHUNK, n - len(run.ids)))]
        run.ids += run.mem.store_many(texts, namespace=NAMESPACE)
    while watch.pending or watch.notes < n:
        time.sleep(POLL_S)
        watch.poll()
    took = time.monotonic() - started
    return Checkpoint(n, rate=(n - first) / took, stretch_s=took, stall_s=watch.stall_s)


def used_memory(r: Redis) -> int:
    return int(r.info("memory")["used_memory"])


def measure_checkpoint(run: Run, cp: Checkpoint, sampler: RssSampler) -> None:
    cp.rss_mib = sampler.take()
    cp.used_per_note = (used_memory(run.r) - run.base_memory) / cp.n
    cp.integrity = integrity(run, cp.n)
    cp.memory, cp.encodings = memory_by_kind(run, cp.n)
    cp.raw = measure_raw(run.url)
    cp.search = timed_search(run, {})
    cp.dense = timed_search(run, DENSE)
    cp.load = loadavg()
    log.info(
        "N=%d: %.0f notes/s over %.0fs (longest stall %.1fs), RSS %.0f MiB, Redis %.0f B/note, "
        "search %s, dense %s, raw LPUSH p50 %.0f us",
        cp.n,
        cp.rate,
        cp.stretch_s,
        cp.stall_s,
        cp.rss_mib,
        cp.used_per_note,
        fmt_ms(cp.search),
        fmt_ms(cp.dense),
        cp.raw.p50_us,
    )


def timed_search(run: Run, weights: dict[str, float]) -> Latency:
    queries = [run.queries.query() for _ in range(WARMUP + SEARCHES)]

    def call(i: int) -> None:
        run.mem.search(
            queries[i],
            namespace=NAMESPACE,
            k=K,
            fresh=True,
            weights=weights,
            timeout_s=SEARCH_TIMEOUT_S,
        )

    return timed(call, SEARCHES, WARMUP)


def integrity(run: Run, n: int) -> list[str]:
    """The failed checks of 0 lost / 0 duplicated (empty when every one holds)."""
    keys, r = run.mem.keys, run.r
    active = keys.active(NAMESPACE)
    missing = 0
    for start in range(0, len(run.ids), READ_CHUNK):
        scores = r.zmscore(active, run.ids[start : start + READ_CHUNK])
        missing += sum(s is None for s in scores)
    found = {
        "ids returned by store_many": len(set(run.ids)),
        "active zset (ZCARD)": r.zcard(active),
        "seq -> id hash (HLEN)": r.hlen(keys.seqs(NAMESPACE)),
    }
    failed = [f"{name} {count:,} != {n:,}" for name, count in found.items() if count != n]
    if missing:
        failed.append(f"{missing:,} returned ids not active")
    for name, length in (
        ("inbox", r.xlen(keys.inbox(keys.shard_of(NAMESPACE)))),
        ("dead-letter stream", r.xlen(keys.dead())),
    ):
        if length:
            failed.append(f"{name} holds {length:,}")
    return failed


def memory_by_kind(
    run: Run, n: int
) -> tuple[list[tuple[str, int, float]], dict[str, Counter[str]]]:
    """(kind, keys, bytes per note) rows, the sampled kinds estimated from MEMORY_SAMPLE keys,
    and the encodings of the sampled hashes."""
    counts: Counter[str] = Counter()
    whole: list[tuple[str, str]] = []
    for raw in run.r.scan_iter(match=f"{PREFIX}:*", count=READ_CHUNK):
        key = raw.decode()
        kind = key_kind(key)
        counts[kind] += 1
        if kind not in ("note", "links"):
            whole.append((kind, key))
    rng = random.Random(n)
    sample = rng.sample(run.ids, min(MEMORY_SAMPLE, len(run.ids)))
    keys = run.mem.keys
    totals: Counter[str] = Counter()
    encodings: dict[str, Counter[str]] = {}
    for kind, key_of in (("note", keys.note), ("links", keys.links)):
        pipe = run.r.pipeline(transaction=False)
        for nid in sample:
            pipe.memory_usage(key_of(NAMESPACE, nid), samples=0)
            pipe.object("encoding", key_of(NAMESPACE, nid))
        replies = pipe.execute()
        sizes = [s for s in replies[0::2] if s is not None]
        encodings[kind] = Counter(e.decode() if e else "missing" for e in replies[1::2])
        totals[kind] = round(sum(sizes) / max(1, len(sizes)) * counts[kind])
    for start in range(0, len(whole), READ_CHUNK):
        batch = whole[start : start + READ_CHUNK]
        pipe = run.r.pipeline(transaction=False)
        for _, key in batch:
            pipe.memory_usage(key, samples=0)
        for (kind, _), size in zip(batch, pipe.execute(), strict=True):
            totals[kind] += size or 0
    big = [kind for kind in sorted(counts, key=lambda k: -totals[k]) if totals[kind] >= n]
    rows = [(kind, counts[kind], totals[kind] / n) for kind in big]
    small = [kind for kind in counts if kind not in big]
    rows.append(("other", sum(counts[k] for k in small), sum(totals[k] for k in small) / n))
    return rows, encodings


def key_kind(key: str) -> str:
    """``note``, ``links``, ``active``, ... for a namespace key; the first part after the prefix
    (``dead``, ``runs``, ``{s3}`` shard keys as ``shard``) otherwise."""
    rest = key[len(PREFIX) + 1 :]
    if rest.startswith(f"{{{NAMESPACE}}}:"):
        return rest[len(NAMESPACE) + 3 :].split(":", 1)[0]
    part = rest.split(":", 1)[0]
    return "shard" if part.startswith("{s") else part


# --- snapshots and recall --------------------------------------------------------------------


def change_tail(run: Run) -> str:
    last = run.r.xrevrange(run.mem.keys.changes(NAMESPACE), count=1)
    return last[0][0].decode() if last else "0-0"


def wait_snapshot(run: Run, ctx: WorkerContext, proc: subprocess.Popen[bytes]) -> Snapshot:
    """Wait until the worker saved the namespace at the change log's tail; the snapshot path."""
    settings = ctx.settings
    path = snapshot_path(ctx, NAMESPACE)
    tail, started = change_tail(run), time.monotonic()
    deadline = started + settings.snapshot_every_s + SNAPSHOT_TIMEOUT_S
    seen = 0
    while True:
        stamp = mtime_ns(path.with_suffix(".meta"))
        if stamp is not None and stamp != seen:
            seen = stamp
            if snapshot_position(path) == tail:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no snapshot at {tail} in {path.parent}")
        time.sleep(1.0)
    saved = Snapshot(path, save_seconds(run, seen / 1e9), size_mib(path))
    log.info(
        "snapshot at %s after %.1fs: saved in %.1fs, %.0f MiB",
        tail,
        time.monotonic() - started,
        saved.seconds,
        saved.mib,
    )
    return saved


@dataclass(frozen=True)
class Snapshot:
    path: Path
    seconds: float  #: the snapshot run that wrote it (catch-up and save, lock held)
    mib: float


def save_seconds(run: Run, written_at: float) -> float:
    """How long the snapshot run that finished writing at ``written_at`` took, once recorded."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        raw = run.r.hget(run.mem.keys.runs(), "snapshot")
        record = json.loads(raw) if raw else {}
        if record.get("namespaces") and record["at"] + record["seconds"] >= written_at - 1.0:
            return float(record["seconds"])
        time.sleep(0.2)
    return float("nan")


def snapshot_position(path: Path) -> str | None:
    """The change-log position in the snapshot's sidecar, read without unpacking its notes."""
    try:
        with path.with_suffix(".meta").open("rb") as f:
            unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
            for _ in range(unpacker.read_map_header()):
                if unpacker.unpack() == "position":
                    return str(unpacker.unpack())
                unpacker.skip()
    except (OSError, ValueError, msgpack.UnpackException):
        return None
    return None


def mtime_ns(path: Path) -> int | None:
    """The file's modification time, None while it does not exist."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def size_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in (path, path.with_suffix(".meta"))) / 2**20


def active_members(run: Run) -> dict[str, int]:
    raw = run.r.zrange(run.mem.keys.active(NAMESPACE), 0, -1, withscores=True)
    return {m.decode(): int(s) for m, s in raw}


def note_fields(run: Run, ids: Sequence[str], name: str) -> list[bytes | None]:
    """Field ``name`` of each note, pipelined."""
    out: list[bytes | None] = []
    for start in range(0, len(ids), READ_CHUNK):
        pipe = run.r.pipeline(transaction=False)
        for nid in ids[start : start + READ_CHUNK]:
            pipe.hget(run.mem.keys.note(NAMESPACE, nid), name)
        out += pipe.execute()
    return out


def true_vectors(run: Run, members: dict[str, int]) -> tuple[Seqs, Floats]:
    """(seqs, L2-normalised vectors) of the active notes, read from their hashes."""
    ids = list(members)
    seqs = np.fromiter((members[i] for i in ids), dtype=np.int64, count=len(ids))
    vecs: Floats | None = None
    for start in range(0, len(ids), READ_CHUNK):
        rows = note_fields(run, ids[start : start + READ_CHUNK], "vec")
        chunk = np.vstack([np.frombuffer(raw or b"", dtype=np.float32) for raw in rows])
        if vecs is None:
            vecs = np.empty((len(ids), chunk.shape[1]), dtype=np.float32)
        vecs[start : start + len(chunk)] = chunk
    if vecs is None:
        raise RuntimeError("no active note to measure recall on")
    faiss.normalize_L2(vecs)
    return seqs, vecs


def measure_recall(run: Run, ctx: WorkerContext, path: Path) -> None:
    started = time.monotonic()
    index = VectorIndex.load(path)
    members = active_members(run)
    seqs, vecs = true_vectors(run, members)
    exact = faiss.IndexFlatIP(vecs.shape[1])
    exact.add(vecs)
    texts = [run.queries.query() for _ in range(RECALL_QUERIES)]
    queries = np.ascontiguousarray(ctx.embedder.embed(texts), dtype=np.float32)
    faiss.normalize_L2(queries)
    _, rows = exact.search(queries, K)
    _, found = index.search(queries, K)
    truth = seqs[rows]
    recall = overlap(found, truth)
    if index.kind == "ivf":
        sweep_nprobe(run, index, queries, truth)
    run.facts["index"] = f"{index.kind}, {len(index):,} vectors, nprobe {index.nprobe}"
    run.facts["recall took"] = f"{time.monotonic() - started:.0f} s"
    run.check(
        f"dense recall@{K} against exact search, {RECALL_QUERIES:,} queries, ≥ {RECALL_GOAL}",
        recall >= RECALL_GOAL,
        f"{recall:.3f} ({run.facts['index']}, the ingest worker's snapshot)",
    )
    check_index(run, "ingest snapshot", index, members, set())


def sweep_nprobe(run: Run, index: VectorIndex, queries: Floats, truth: Seqs) -> None:
    """Recall and batch search time of the loaded IVF index at other nprobe values."""
    worker_nprobe, sweep = index.nprobe, []
    queries, truth = queries[:SWEEP_QUERIES], truth[:SWEEP_QUERIES]
    for nprobe in NPROBE_SWEEP:
        index.nprobe = nprobe
        began = time.perf_counter()
        found = index.search(queries, K)[1]
        per_query_ms = (time.perf_counter() - began) * 1000 / len(queries)
        sweep.append(f"nprobe {nprobe}: {overlap(found, truth):.3f} ({per_query_ms:.2f} ms/query)")
    index.nprobe = worker_nprobe
    run.check(
        f"recall@10 of that index by nprobe, first {SWEEP_QUERIES} queries (one thread, batched)",
        None,
        "; ".join(sweep),
    )


def overlap(found: Seqs, truth: Seqs) -> float:
    """Mean share of each row of ``truth`` found in the same row of ``found``."""
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True))
    return hits / truth.size


def check_index(
    run: Run, name: str, index: VectorIndex, members: dict[str, int], gone: set[int]
) -> None:
    """The snapshot's index holds exactly the active notes' seqs, and none of ``gone``."""
    missing = sum(seq not in index for seq in members.values())
    kept = sum(seq in index for seq in gone)
    ok = missing == 0 and kept == 0 and len(index) == len(members)
    value = f"{len(index):,} vectors for {len(members):,} active notes, {missing:,} missing"
    if gone:
        value += f", {kept:,} of {len(gone):,} removed notes still in it"
    run.check(f"{name}: the approximate index holds exactly the active notes", ok, value)


# --- restart, delete, evict -------------------------------------------------------------------


def hit_ids(run: Run, query: str, weights: dict[str, float]) -> list[str]:
    """The ids a search answers, best first (reinforce off: the search changes nothing)."""
    hits = run.mem.search(
        query,
        namespace=NAMESPACE,
        k=K,
        weights=weights,
        reinforce=False,
        timeout_s=SEARCH_TIMEOUT_S,
    )
    return [h.id for h in hits]


def answers(run: Run, queries: Sequence[str]) -> dict[str, list[list[str]]]:
    """Hit ids per query, by the default channels and by the dense one alone."""
    return {mode: [hit_ids(run, q, weights) for q in queries] for mode, weights in MODES}


def compare(
    run: Run,
    name: str,
    seconds: float,
    before: dict[str, list[list[str]]],
    after: dict[str, list[list[str]]],
) -> None:
    parts = []
    for mode in before:
        same = sum(set(a) == set(b) for a, b in zip(before[mode], after[mode], strict=True))
        ordered = sum(a == b for a, b in zip(before[mode], after[mode], strict=True))
        parts.append(f"{mode}: {same}/{len(before[mode])} same ids ({ordered} same order)")
        run.facts[f"{name} {mode} same"] = same == len(before[mode])
    run.facts[f"{name} start"] = seconds
    run.facts[f"{name} answers"] = "; ".join(parts)
    log.info("%s start: first answer after %.1fs; %s", name, seconds, "; ".join(parts))


def found_by_content(
    run: Run, ids: Sequence[str], contents: Sequence[bytes | None], weights: dict[str, float]
) -> int:
    """How many of ``ids`` are among the hits of a search for their own content."""
    pairs = zip(ids, contents, strict=True)
    return sum(nid in hit_ids(run, content.decode(), weights) for nid, content in pairs if content)


def check_gone(run: Run, what: str, ids: list[str], contents: Sequence[bytes | None]) -> None:
    """None of ``ids`` is found by its own content; live notes are (the control)."""
    live = random.Random(len(ids)).sample(list(active_members(run)), CONTROLS)
    live_contents = note_fields(run, live, "content")
    for mode, weights in MODES:
        back = found_by_content(run, ids, contents, weights)
        control = found_by_content(run, live, live_contents, weights)
        run.check(
            f"{what}: none found by a search ({mode}) for its own content",
            back == 0 and control >= 0.9 * CONTROLS,
            f"{back} of {len(ids):,} found; control: {control} of {CONTROLS} live notes found",
        )


def delete_some(run: Run, ctx: WorkerContext, proc: subprocess.Popen[bytes]) -> set[int]:
    """Delete DELETES random notes through the client and check them; their seqs."""
    r, keys = run.r, run.mem.keys
    before = r.zcard(keys.active(NAMESPACE))
    victims = random.Random(DELETES).sample(list(active_members(run)), DELETES)
    contents = note_fields(run, victims, "content")
    seqs = {int(s) for s in r.zmscore(keys.active(NAMESPACE), victims) if s is not None}
    started = time.monotonic()
    for nid in victims:
        run.mem.delete(nid, namespace=NAMESPACE)
    run.mem.flush(NAMESPACE, timeout_s=300)
    run.facts["delete took"] = f"{time.monotonic() - started:.1f} s for {DELETES:,} deletes"
    after = r.zcard(keys.active(NAMESPACE))
    still = sum(s is not None for s in r.zmscore(keys.active(NAMESPACE), victims))
    run.check(
        f"delete {DELETES:,}: active count falls by exactly that, none left active",
        after == before - DELETES and still == 0,
        f"{before:,} -> {after:,}, {still} still active",
    )
    check_gone(run, f"{DELETES:,} deleted notes", victims, contents)
    index = VectorIndex.load(wait_snapshot(run, ctx, proc).path)
    check_index(run, "after the deletes", index, active_members(run), seqs)
    return seqs


def evict_some(run: Run, ctx: WorkerContext, deleted: set[int]) -> None:
    """Restart with ZQ_MAX_NOTES below the count, run eviction, check it."""
    before = active_members(run)
    excess = min(ctx.settings.periodic_max_work or len(before), max(DELETES, len(before) // 100))
    cap = len(before) - excess
    with worker(run, "evict", ZQ_MAX_NOTES=str(cap)) as proc:
        first_answer(run, time.monotonic())
        started = time.monotonic()
        done = run.mem.organise(NAMESPACE, jobs=["evict"], timeout_s=300)
        work = ", ".join(f"{j.job}: work {j.work:,} in {j.seconds:.1f} s" for j in done.runs)
        run.facts["evict took"] = f"{time.monotonic() - started:.1f} s ({work})"
        after = active_members(run)
        evicted = [nid for nid in before if nid not in after]
        run.check(
            f"evict to ZQ_MAX_NOTES={cap:,}: the count falls to the cap, only by eviction",
            len(after) == cap and len(evicted) == excess and set(after) <= set(before),
            f"{len(before):,} -> {len(after):,}, {len(evicted):,} evicted",
        )
        sample = random.Random(cap).sample(evicted, min(DELETES, len(evicted)))
        check_gone(
            run, f"{len(sample):,} evicted notes", sample, note_fields(run, sample, "content")
        )
        index = VectorIndex.load(wait_snapshot(run, ctx, proc).path)
    check_index(run, "after the eviction", index, after, deleted | {before[nid] for nid in evicted})


def restart_and_delete(
    run: Run, ctx: WorkerContext, queries: list[str], before: dict[str, list[list[str]]]
) -> set[int]:
    started = time.monotonic()
    with worker(run, "warm"):
        warm = first_answer(run, started)
        compare(run, "warm", warm, before, answers(run, queries))
    shutil.rmtree(run.index_dir)
    started = time.monotonic()
    with worker(run, "cold") as proc:
        cold = first_answer(run, started)
        compare(run, "cold", cold, before, answers(run, queries))
        run.check(
            f"warm start (snapshot) ≤ {WARM_GOAL_S:.0f} s, and faster than a cold rebuild",
            warm <= WARM_GOAL_S and warm < cold,
            f"warm {warm:.1f} s, cold {cold:.1f} s (process start to first answer)",
        )
        return delete_some(run, ctx, proc)


# --- the run ---------------------------------------------------------------------------------


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
                measure_checkpoint(run, cp, sampler)
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
    corpus = Corpus(seed=3)
    queries = [corpus.query() for _ in range(RESTART_QUERIES)]
    before, saved = ingest(run, ctx, queries)
    with phase(run, "recall"):
        measure_recall(run, ctx, saved.path)
    deleted: set[int] = set()
    with phase(run, "restart and delete"):
        deleted = restart_and_delete(run, ctx, queries, before)
    with phase(run, "eviction"):
        evict_some(run, ctx, deleted)


# --- the report ------------------------------------------------------------------------------


def fmt_lat(lat: Latency | None) -> str:
    return fmt_ms(lat).replace(" ms / ", " / ")


def checkpoint_table(run: Run) -> list[str]:
    cps = run.checkpoints
    rows: list[tuple[str, Callable[[Checkpoint], str]]] = [
        ("organised notes/s over the stretch", lambda c: f"{c.rate:,.0f} ({c.stretch_s:.0f} s)"),
        ("longest spell with jobs queued and none organised", lambda c: f"{c.stall_s:.1f} s"),
        ("snapshot once drained: save (lock held), size", snapshot_cell),
        ("worker tree peak RSS over the stretch", lambda c: f"{c.rss_mib:,.0f} MiB"),
        (
            "Redis used_memory per note (above the empty server)",
            lambda c: f"{c.used_per_note:,.0f} B",
        ),
        ("search (default channels), p50 / p99", lambda c: fmt_lat(c.search)),
        ("search (dense channel alone), p50 / p99", lambda c: fmt_lat(c.dense)),
        ("raw LPUSH p50 (the base)", lambda c: f"{c.raw.p50_us:.0f} µs" if c.raw else "—"),
        ("search / raw p50, default / dense", ratios),
        (
            "0 lost / 0 duplicated",
            lambda c: "PASS" if not c.integrity else "FAIL: " + "; ".join(c.integrity),
        ),
        ("1-min load average", lambda c: c.load),
    ]
    out = ["| measure | " + " | ".join(f"N = {c.n:,}" for c in cps) + " |"]
    out.append("|---" * (len(cps) + 1) + "|")
    out += [f"| {name} | " + " | ".join(cell(c) for c in cps) + " |" for name, cell in rows]
    return out


def snapshot_cell(c: Checkpoint) -> str:
    return f"{c.snapshot.seconds:.1f} s, {c.snapshot.mib:,.0f} MiB" if c.snapshot else "—"


def ratios(c: Checkpoint) -> str:
    if not (c.raw and c.search and c.dense):
        return "—"
    return f"{c.search.p50_us / c.raw.p50_us:.1f}x / {c.dense.p50_us / c.raw.p50_us:.1f}x"


def memory_table(run: Run) -> list[str]:
    cps = run.checkpoints
    kinds = list(dict.fromkeys(kind for c in cps for kind, _, _ in c.memory))
    out = ["| key kind | " + " | ".join(f"N = {c.n:,}: B/note (keys)" for c in cps) + " |"]
    out.append("|---" * (len(cps) + 1) + "|")
    for kind in kinds:
        cells = []
        for c in cps:
            row = next((r for r in c.memory if r[0] == kind), None)
            cells.append(f"{row[2]:,.1f} ({row[1]:,})" if row else "—")
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    sums = [sum(r[2] for r in c.memory) for c in cps]
    out.append("| sum of MEMORY USAGE | " + " | ".join(f"{s:,.0f}" for s in sums) + " |")
    out.append(
        "| used_memory delta (the sum + allocator and keyspace overhead) | "
        + " | ".join(f"{c.used_per_note:,.0f}" for c in cps)
        + " |"
    )
    return out


def per_million(run: Run) -> str:
    """RSS and Redis memory scaled to a million notes, and the audit stream's share."""
    first, top = run.checkpoints[0], run.checkpoints[-1]
    text = f"At N = {top.n:,}: worker tree peak RSS {top.rss_mib / 1024:,.2f} GiB"
    if top.n > first.n:
        slope = (top.rss_mib - first.rss_mib) / (top.n - first.n) * 1e6 / 1024
        text += f" ({slope:,.2f} GiB per million notes from N = {first.n:,} on)"
    audit = next((b for kind, _, b in top.memory if kind == "audit"), 0.0)
    return (
        f"{text}; Redis used_memory {top.used_per_note * 1e6 / 2**30:,.2f} GiB per million notes, "
        f"{audit * 1e6 / 2**30:,.2f} GiB of it the audit stream (one entry per note; the periodic "
        "audit job, not run here, trims it to ZQ_AUDIT_MAX entries, 100,000 by default)."
    )


def goals(run: Run) -> None:
    """The issue's goals over the checkpoints, appended to the checks."""
    first, top = run.checkpoints[0], run.checkpoints[-1]
    scope = "" if top.n == 1_000_000 else f" (goal stated at 1M; measured at {top.n:,})"
    for cp in run.checkpoints:
        run.check(
            f"N={cp.n:,}: 0 lost, 0 duplicated",
            not cp.integrity,
            "; ".join(cp.integrity) or "all held",
        )
    if top.search and first.search:
        run.check(
            f"search p50 ≤ {P50_GOAL_MS:.0f} ms at the top size{scope}",
            top.search.p50_us <= P50_GOAL_MS * 1000,
            fmt_ms(top.search),
        )
        growth = top.search.p50_us / first.search.p50_us
        grown = (
            ""
            if (first.n, top.n) == (10_000, 1_000_000)
            else f" (goal 10k → 1M; measured {first.n:,} → {top.n:,})"
        )
        run.check(
            f"search p50 growth ≤ {GROWTH_GOAL:.0f}x{grown}",
            growth <= GROWTH_GOAL,
            f"{growth:.2f}x",
        )
    if "warm answers" in run.facts:
        same = run.facts["warm default same"] and run.facts["warm dense same"]
        run.check(
            f"warm restart answers the {RESTART_QUERIES} queries as before",
            same,
            run.facts["warm answers"],
        )
    if "cold answers" in run.facts:
        run.check(
            f"cold rebuild answers the {RESTART_QUERIES} queries as before (its IVF lists are "
            "trained on another count than the ingest's, so dense answers may differ)",
            None,
            run.facts["cold answers"],
        )


def report(run: Run, started: str, redis_info: dict[str, str]) -> str:
    measured = list(run.checks)
    run.checks.clear()
    goals(run)
    run.checks += measured
    top = run.checkpoints[-1]
    snaps = sorted(run.snapshot_runs.values())
    lines = [
        f"Run started {started}; code {run.facts['code']}; {run.facts['cpus']} CPUs; 1-min load "
        f"{run.facts['load start']} at the start, {loadavg()} at the end; "
        f"total {run.facts['took']}.",
        "",
        f"Redis {redis_info['redis_version']} started by the bench, no RDB and no AOF "
        f"({', '.join(f'{k} {v!r}' for k, v in redis_info.items() if k != 'redis_version')}); "
        f"extra --redis-arg: {' '.join(run.args.redis_arg) or 'none'}. Worker environment "
        f"beyond the bench's own: {' '.join(run.args.worker_env) or 'none'}; ZQ_SNAPSHOT_EVERY_S="
        f"{run.args.snapshot_every_s:g}.",
        "",
        *checkpoint_table(run),
        "",
        per_million(run),
        "",
        f"Redis memory by key kind (MEMORY USAGE SAMPLES 0; note and links hashes estimated from "
        f"{MEMORY_SAMPLE:,} random ones):",
        "",
        *memory_table(run),
        "",
        "Encodings of the sampled hashes at N = "
        + f"{top.n:,}: "
        + "; ".join(f"{k}: {dict(v)}" for k, v in top.encodings.items())
        + ".",
        "",
        "Ingest rate by N (notes organised, notes/s over the last "
        f"{PROGRESS_S:.0f} s): "
        + (", ".join(f"{n:,}: {r:,.0f}" for n, r in run.rates) or "—")
        + ".",
        f"Snapshot runs seen by the ingest polls: {len(snaps)} saves, longest "
        f"{max(snaps, default=0):.1f} s, total {sum(snaps):.1f} s (each holds the projection's "
        "lock: ingest and search wait).",
        "Index rebuilds logged (worker, kind, from, n, ms): "
        + ("; ".join(" ".join(row) for row in run.facts.get("rebuilds", [])) or "none")
        + ".",
    ]
    for name in ("recall took", "delete took", "evict took", "worker errors"):
        if name in run.facts:
            lines.append(f"{name}: {run.facts[name]}.")
    lines += ["", *(f"- {name}: {value} → {verdict(ok)}" for name, ok, value in run.checks)]
    return "\n".join(lines) + "\n"


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
