"""Growing the namespace to each checkpoint, and what is measured there: ingest rate, RSS,
Redis memory by key kind, search latency against a raw round trip, 0 lost / 0 duplicated."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import time
from collections import Counter

from bench.foundation import (
    Latency,
    RssSampler,
    fmt_ms,
    loadavg,
    measure_raw,
    timed,
)
from bench.scale.state import (
    BACKLOG_MAX,
    CHUNK,
    DENSE,
    MEMORY_SAMPLE,
    NAMESPACE,
    POLL_S,
    PREFIX,
    PROGRESS_S,
    READ_CHUNK,
    SEARCH_TIMEOUT_S,
    SEARCHES,
    STALL_S,
    WARMUP,
    Checkpoint,
    K,
    Run,
    used_memory,
)
from worker.context import WorkerContext
from worker.organise import audit

log = logging.getLogger(__name__)


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


def measure_checkpoint(run: Run, ctx: WorkerContext, cp: Checkpoint, sampler: RssSampler) -> None:
    cp.rss_mib = sampler.take()
    if run.args.trim_audit:  # as the periodic audit job does, to ZQ_AUDIT_MAX entries
        log.info("N=%d: audit trimmed by %d entries", cp.n, audit.trim(ctx, NAMESPACE))
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
        "seqs handed out (GET seq)": int(r.get(keys.seq(NAMESPACE)) or 0),
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
