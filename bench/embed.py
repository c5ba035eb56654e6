"""HashingEmbedder microbenchmark: one query, one query of new words, and notes in batches of
256, by two trees of the code side by side, with a check that both give the same bytes.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/embed.py --base /tmp/base-tree``
(a checkout of the base, e.g. ``git worktree add /tmp/base-tree main``; about a minute). Without
``--base`` only this tree is measured.

Each measurement runs in a process of its own (this script with ``--measure KIND``, its
``PYTHONPATH`` and working directory the tree), in rounds ordered base, head, head, base, and
reports CPU time (``time.process_time``), the best of ``REPEAT`` passes. A process measures one
kind only: timed after the query passes in the same process, the batch moved by up to ~4 us per
note between versions whose batch code was the same (the heap the queries left behind), which
would hide a real difference:

- ``query_us``: ``embed([query])`` of 1,000 ``Corpus(9).query()`` (3-6 words), per query, once
  every word is in the feature cache (a search of words seen before);
- ``new_query_us``: the same queries through a new embedder, whose cache is empty (every word is
  new once, as after a restart or for words no note or query had);
- ``batch_note_us``: 2,560 ``Corpus(7).note()`` (~200 bytes) in calls of 256, per note, warm cache
  (what ingest pays per note).

``digest`` is the SHA-256 of every vector: the queries one at a time and the notes in batches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUERIES = 1_000  #: queries per pass
NOTES = 2_560  #: notes per pass
BATCH = 256  #: notes per embed call (the worker's default ingest batch)
REPEAT = 5  #: passes per measurement; the best counts
ROUNDS = 3  #: rounds of base, head, head, base
KINDS = (
    "query_us",
    "new_query_us",
    "batch_note_us",
)  #: what is measured, each in its own processes


def measure(kind: str) -> dict[str, float | str]:
    """Time one kind of call of this tree's HashingEmbedder (the one on sys.path), in a fresh
    process, and digest every vector it gives."""
    from bench.foundation import Corpus
    from worker.models.hashing import HashingEmbedder

    asker, writer = Corpus(9), Corpus(7)
    queries = [asker.query() for _ in range(QUERIES)]
    notes = [writer.note() for _ in range(NOTES)]
    embedder = HashingEmbedder()
    digest = hashlib.sha256()
    for query in queries:
        digest.update(embedder.embed([query]).tobytes())
    for start in range(0, NOTES, BATCH):
        digest.update(embedder.embed(notes[start : start + BATCH]).tobytes())

    def one(fresh: bool) -> None:
        target = HashingEmbedder() if fresh else embedder
        for query in queries:
            target.embed([query])

    def batches() -> None:
        for start in range(0, NOTES, BATCH):
            embedder.embed(notes[start : start + BATCH])

    runs = {
        "query_us": (lambda: one(False), QUERIES),
        "new_query_us": (lambda: one(True), QUERIES),
        "batch_note_us": (batches, NOTES),
    }
    run, items = runs[kind]
    return {kind: best_us(run, items), "digest": digest.hexdigest()}


def best_us(run: Callable[[], None], items: int) -> float:
    """The best of REPEAT passes of ``run``, in CPU microseconds per item."""
    times = []
    for _ in range(REPEAT):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times) / items * 1e6


def run_tree(tree: Path, kind: str) -> dict[str, float | str]:
    """One measurement of ``tree``'s code in a process of its own."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, __file__, "--measure", kind],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float | str] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--measure", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    trees = {"head": ROOT} if args.base is None else {"base": args.base, "head": ROOT}
    runs: dict[str, list[dict[str, float | str]]] = {name: [] for name in trees}
    order = ["base", "head", "head", "base"] if args.base else ["head"]
    for _ in range(ROUNDS):
        for kind in KINDS:
            for name in order:
                runs[name].append(run_tree(trees[name], kind))
    report(runs)


def report(runs: dict[str, list[dict[str, float | str]]]) -> None:
    """Print the median of each measurement per tree, and whether the vectors agree."""
    processes = len(runs["head"]) // len(KINDS)
    print(f"load {os.getloadavg()[0]:.2f}; CPU us, median of {processes} processes")
    for name, results in runs.items():
        cells = [
            f"{key} {statistics.median(float(r[key]) for r in results if key in r):.1f}"
            for key in KINDS
        ]
        print(f"{name:5} " + "  ".join(cells))
    digests = {str(r["digest"]) for results in runs.values() for r in results}
    print("vectors identical" if len(digests) == 1 else f"VECTORS DIFFER: {sorted(digests)}")


if __name__ == "__main__":
    main()
