"""The approximate index under test: the worker's snapshots, dense recall against exact search,
warm and cold restarts, and deletes and eviction leaving no trace in the index or the answers."""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import faiss
import msgpack
import numpy as np

from bench.scale.state import (
    CONTROLS,
    DELETES,
    MODES,
    NAMESPACE,
    NPROBE_SWEEP,
    READ_CHUNK,
    RECALL_GOAL,
    RECALL_QUERIES,
    SNAPSHOT_TIMEOUT_S,
    SWEEP_QUERIES,
    WARM_GOAL_S,
    K,
    Run,
    Snapshot,
    active_members,
    first_answer,
    hit_ids,
    note_fields,
    worker,
)
from worker import vectors
from worker.context import WorkerContext
from worker.index.kinds import Floats, Seqs
from worker.index.projection import snapshot_path
from worker.index.vector import VectorIndex

log = logging.getLogger(__name__)


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


def true_vectors(run: Run, members: dict[str, int]) -> tuple[Seqs, Floats]:
    """(seqs, L2-normalised vectors) of the active notes, read from their hashes."""
    ids = list(members)
    seqs = np.fromiter((members[i] for i in ids), dtype=np.int64, count=len(ids))
    vecs: Floats | None = None
    for start in range(0, len(ids), READ_CHUNK):
        rows = note_fields(run, ids[start : start + READ_CHUNK], "vec")
        chunk = np.vstack([vectors.decode(raw or b"") for raw in rows])  # float32 or float16
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
    share = ctx.settings.ivf_search_share
    _, found = index.search(queries, K, share)  # as a search scans it (linking: nprobe)
    truth = seqs[rows]
    recall = overlap(found, truth)
    if index.kind == "ivf":
        sweep_nprobe(run, index, queries, truth)
    run.facts["index"] = (
        f"{index.kind}, {len(index):,} vectors, nprobe {index.nprobe}, search share {share:g}"
    )
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
