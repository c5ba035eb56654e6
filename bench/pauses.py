"""Pauses a large projection makes its process take: a full garbage collection, a snapshot's
copy of it, and reading the snapshot's sidecar back.

One process, no Redis: a ``Projection`` of ``--notes`` notes (``foundation.py``'s corpus, each
note's BM25 terms and its first 8 distinct terms as keywords; random 256-d vectors, so the index
is IVF past 5,000 notes), then, ``--repeats`` times each:

1. a full ``gc.collect()``: its time, and the objects the collector tracks;
2. ``freeze`` (what a snapshot copies): how long it took, how long the projection's lock was
   held at once (searches and drains of the namespace wait for it), and how late a thread that
   sleeps 1 ms in a loop woke meanwhile (any thread of the process waits for the GIL as long);
   then the copy dropped as the snapshotter drops it, and the sleeper's lateness meanwhile;
3. reading the sidecar ``write_snapshot`` wrote: its time and the sleeper's lateness.

It measures the tree on ``PYTHONPATH``; a tree whose ``freeze`` copies under the caller's lock
(before 2026-12-07 17:20 UTC) is called under it, and one without ``unpack_side`` reads the
sidecar in one ``msgpack.unpackb``, as each ran in a worker::

    PYTHONPATH=. .venv/bin/python bench/pauses.py --notes 300000
"""

from __future__ import annotations

import argparse
import gc
import inspect
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np

from bench.foundation import Corpus
from producer.keys import Keys
from worker.index import projection
from worker.index.lexical import LexicalIndex, analyze
from worker.index.projection import Projection, freeze, write_snapshot
from worker.index.vector import VectorIndex
from worker.settings import WorkerSettings

DIM = 256
CHUNK = 10_000  #: notes added to the projection at a time
KEYWORDS = 8  #: keywords a note keeps (construction.MAX_KEYWORDS)


class Sleeper:
    """A thread that sleeps 1 ms in a loop and records how late it wakes."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            time.sleep(0.001)
            self.late.append(time.perf_counter() - started - 0.001)

    @contextmanager
    def watching(self) -> Iterator[list[float]]:
        """The worst lateness (ms) while inside, in the list yielded."""
        self.late.clear()
        worst: list[float] = []
        yield worst
        time.sleep(0.003)  # a wake that was due inside
        worst.append(max(self.late, default=0.0) * 1000)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class TimedLock:
    """The projection's lock, recording how long each hold lasted (the outermost one)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._since = 0.0
        self.holds: list[float] = []

    def __enter__(self) -> TimedLock:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._since = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(time.perf_counter() - self._since)
        self._lock.release()


def filled(notes: int) -> Projection:
    corpus, rng = Corpus(7), np.random.default_rng(0)
    proj = Projection("bench", VectorIndex(DIM, ann_threshold=5_000), LexicalIndex())
    for start in range(0, notes, CHUNK):
        seqs = list(range(start, min(start + CHUNK, notes)))
        terms = [analyze(corpus.note()) for _ in seqs]
        keywords = [frozenset(list(dict.fromkeys(t))[:KEYWORDS]) for t in terms]
        vecs = rng.standard_normal((len(seqs), DIM), dtype=np.float32)
        proj.add(seqs, [f"n{s:012d}" for s in seqs], vecs, keywords, terms, rebuild=True)
    return proj


def copied(source: Any, proj: Projection) -> Any:
    """``freeze`` as a snapshot runs it in this tree."""
    if "settle" in inspect.signature(freeze).parameters:
        return freeze(source, proj)
    with proj.lock:
        return freeze(source, proj)


def dropped(frozen: Any) -> None:
    """Drop a copy as a snapshot does once written (in this tree): ``Frozen.release`` where
    there is one (the caller's reference then frees the rest)."""
    release = getattr(frozen, "release", None)
    if release is not None:
        release()


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = call()
    return out, (time.perf_counter() - started) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--notes", type=int, default=300_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    began = time.perf_counter()
    proj = filled(args.notes)
    lock = proj.lock = TimedLock()  # type: ignore[assignment]
    built_s = time.perf_counter() - began
    print(f"{args.notes:,} notes, {proj.index.kind} index, built in {built_s:.0f} s")
    read_side = getattr(projection, "unpack_side", None)
    print(f"sidecar read: {'unpack_side' if read_side else 'msgpack.unpackb'}")
    with tempfile.TemporaryDirectory() as tmp:
        source = SimpleNamespace(
            keys=Keys("bench"),
            settings=WorkerSettings(index_dir=Path(tmp)),
            embedder=SimpleNamespace(name=f"hash-v1-d{DIM}", dim=DIM),
        )
        sleeper = Sleeper()
        try:
            for _ in range(args.repeats):
                gc.collect()
                tracked = len(gc.get_objects())
                with sleeper.watching() as late:
                    _, gc_ms = timed(gc.collect)
                print(
                    f"full collection {gc_ms:.1f} ms, {tracked:,} objects tracked; "
                    f"sleeper late {late[0]:.1f} ms at worst"
                )
            for last in range(args.repeats):
                lock.holds.clear()
                with sleeper.watching() as late:
                    frozen, copy_ms = timed(lambda: copied(source, proj))
                print(
                    f"copy {copy_ms:.0f} ms: lock held {len(lock.holds)} times, longest "
                    f"{max(lock.holds) * 1000:.2f} ms, in all {sum(lock.holds) * 1000:.0f} ms; "
                    f"sleeper late {late[0]:.1f} ms at worst"
                )
                if last == args.repeats - 1:
                    break
                with sleeper.watching() as late:
                    started = time.perf_counter()
                    dropped(frozen)
                    frozen = None
                    drop_ms = (time.perf_counter() - started) * 1000
                print(f"copy dropped in {drop_ms:.0f} ms; sleeper late {late[0]:.1f} ms at worst")
            path = write_snapshot(source, frozen)
            raw = path.with_suffix(".meta").read_bytes()
            for _ in range(args.repeats):
                with sleeper.watching() as late:
                    if read_side is not None:
                        _, read_ms = timed(lambda: read_side(raw))
                    else:
                        _, read_ms = timed(
                            lambda: msgpack.unpackb(raw, raw=False, strict_map_key=False)
                        )
                print(
                    f"sidecar of {len(raw) / 2**20:.0f} MiB read in {read_ms:.0f} ms; "
                    f"sleeper late {late[0]:.1f} ms at worst"
                )
        finally:
            sleeper.stop()


if __name__ == "__main__":
    main()
