"""Lexical (BM25) channel microbenchmark: one namespace's ``LexicalIndex`` of synthetic notes in
memory, searched as a search's lexical channel does it, by two versions of the code at once.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/lexical.py`` (default sizes
1,000, 10,000, 100,000 and 1,000,000 notes: about 6 minutes on the 2-core host, 3 GB of memory
per version at 1M). The notes are ``foundation.py``'s seeded ``Corpus`` (Zipf words, ~200-byte
notes), analysed once by this tree's ``analyze``; the queries are 1,000 ``Corpus.query()``.

``--base REV`` (default ``main``) is extracted with ``git archive`` (``worker/`` and
``producer/``) and the working tree is the head: each runs in its own process (this script
with ``--serve``, its ``PYTHONPATH`` the version's tree), fed the same analysed notes. For each
size both build the index (memory traced by ``tracemalloc``: after the notes are added, and
after one untimed pass of the queries, which builds the posting arrays they need), then time
each query on its own (wall clock, and the thread's CPU time, which other processes on a shared
host disturb less) in rounds of ``ROUND`` queries, in the order base, head, head, base.
A query is what ``worker/search/retrieve.py`` ``_channels`` runs with the default settings:
``complete``, ``expand`` (feedback_docs, feedback_terms, feedback_weight) and
``search_weighted`` for search_candidates notes (and ``feedback_term_max_notes``, in versions
that have it). The two versions' answers (seqs and scores) are compared query by query, and
each query's "entries" are those of the final pass's postings, summed (what summing every
entry reads; MaxScore reads fewer).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUERIES = 1_000  #: timed queries per size and version
ROUND = 100  #: queries per timed round (base, head, head, base)
SEED = 3  #: the Corpus seed (bench/million.py's)


class Version:
    """One version of the code in its own process, answering JSON requests line by line."""

    def __init__(self, name: str, tree: Path, corpus: Path) -> None:
        self.name = name
        env = dict(os.environ, PYTHONPATH=str(tree))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(corpus)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def serve(corpus: Path) -> None:
    """The child: build indexes and time queries as the parent asks."""
    from worker.index.lexical import LexicalIndex
    from worker.settings import WorkerSettings

    fields = WorkerSettings.model_fields
    fb = [fields[f].default for f in ("feedback_docs", "feedback_terms", "feedback_weight")]
    if "feedback_term_max_notes" in fields:  # versions that bound the feedback terms' postings
        fb.append(fields["feedback_term_max_notes"].default)
    n = fields["search_candidates"].default
    docs, queries = pickle.loads(corpus.read_bytes())
    index = LexicalIndex()

    def one(terms: list[str]) -> tuple[list[tuple[int, float]], dict[str, float]]:
        query = index.expand(index.complete(terms), *fb)
        return index.search_weighted(query, n), query

    def entries(query: dict[str, float]) -> int:
        """The posting entries of the final pass's terms (``_postings``: both versions have it)."""
        return sum(index._postings[t].df for t in query if t in index._postings)

    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "build":
            index = LexicalIndex()
            tracemalloc.start()
            for seq, terms in enumerate(docs[: request["notes"]]):
                index.add(seq, terms)
            built = tracemalloc.get_traced_memory()[0]
            answers = hashlib.sha1(repr([one(q)[0] for q in queries]).encode()).hexdigest()
            warm = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            reply = {"built_mib": built / 2**20, "warm_mib": warm / 2**20, "answers": answers}
        else:
            samples, cpu, digests, read = [], [], [], []
            for terms in queries[request["start"] : request["stop"]]:
                started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
                found, query = one(terms)
                samples.append(time.perf_counter_ns() - started)
                cpu.append(time.thread_time_ns() - started_cpu)
                digests.append(hashlib.sha1(repr(found).encode()).hexdigest())
                read.append(entries(query))
            reply = {"ns": samples, "cpu_ns": cpu, "digests": digests, "entries": read}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def extract(rev: str, into: Path) -> Path:
    """``worker/`` and ``producer/`` of ``rev``, written under ``into``."""
    tar = subprocess.run(
        ["git", "archive", rev, "worker", "producer"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return into


def write_corpus(path: Path, notes: int) -> None:
    """The analysed notes and queries, pickled for both versions."""
    sys.path.insert(0, str(ROOT))
    from bench.foundation import Corpus
    from worker.index.lexical import analyze

    corpus = Corpus(seed=SEED)
    docs = [analyze(corpus.note()) for _ in range(notes)]
    queries = [analyze(corpus.query()) for _ in range(QUERIES)]
    path.write_bytes(pickle.dumps((docs, queries), protocol=pickle.HIGHEST_PROTOCOL))


def percentile(samples: list[int], q: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def measure(versions: list[Version], notes: int) -> dict[str, Any]:
    built = {v.name: v.ask(op="build", notes=notes) for v in versions}
    samples: dict[str, list[int]] = {v.name: [] for v in versions}
    cpu: dict[str, list[int]] = {v.name: [] for v in versions}
    read: dict[str, list[int]] = {v.name: [0] * QUERIES for v in versions}
    digests: dict[str, list[str]] = {v.name: [""] * QUERIES for v in versions}
    for start in range(0, QUERIES, ROUND):
        for v in [*versions, *reversed(versions)]:
            reply = v.ask(op="time", start=start, stop=start + ROUND)
            samples[v.name] += reply["ns"]
            cpu[v.name] += reply["cpu_ns"]
            digests[v.name][start : start + ROUND] = reply["digests"]
            read[v.name][start : start + ROUND] = reply["entries"]
    base, head = (v.name for v in versions)
    row: dict[str, Any] = {"notes": notes, "load": Path("/proc/loadavg").read_text().split()[0]}
    for name in (base, head):
        row[name] = {
            "p50_ms": percentile(samples[name], 0.50),
            "p99_ms": percentile(samples[name], 0.99),
            "mean_ms": statistics.fmean(samples[name]) / 1e6,
            "cpu_p50_ms": percentile(cpu[name], 0.50),
            "cpu_mean_ms": statistics.fmean(cpu[name]) / 1e6,
            "entries_p50": statistics.median_low(read[name]),
            "entries_p99": sorted(read[name])[int(0.99 * QUERIES)],
            "built_mib": built[name]["built_mib"],
            "warm_mib": built[name]["warm_mib"],
        }
    row["same_answers"] = sum(a == b for a, b in zip(digests[base], digests[head], strict=True))
    return row


def report(rows: list[dict[str, Any]], base: str) -> str:
    lines = [
        f"base {base} vs head (working tree), {QUERIES} queries per size, {os.cpu_count()} cpus",
        "| notes | load | p50 base / head ms | p99 base / head ms | mean base / head ms "
        "| CPU p50 base / head ms | CPU mean base / head ms "
        "| entries p50 base / head | entries p99 base / head "
        "| index MiB base / head | + posting arrays MiB base / head | same answers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, h = r["base"], r["head"]
        lines.append(
            f"| {r['notes']:,} | {r['load']} | {b['p50_ms']:.3f} / {h['p50_ms']:.3f} "
            f"| {b['p99_ms']:.3f} / {h['p99_ms']:.3f} | {b['mean_ms']:.3f} / {h['mean_ms']:.3f} "
            f"| {b['cpu_p50_ms']:.3f} / {h['cpu_p50_ms']:.3f} "
            f"| {b['cpu_mean_ms']:.3f} / {h['cpu_mean_ms']:.3f} "
            f"| {b['entries_p50']:,} / {h['entries_p50']:,} "
            f"| {b['entries_p99']:,} / {h['entries_p99']:,} "
            f"| {b['built_mib']:.0f} / {h['built_mib']:.0f} "
            f"| {b['warm_mib'] - b['built_mib']:.0f} / {h['warm_mib'] - h['built_mib']:.0f} "
            f"| {r['same_answers']}/{QUERIES} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--sizes", default="1000,10000,100000,1000000", help="comma-separated note counts"
    )
    p.add_argument("--base", default="main", help="the git revision to compare with")
    p.add_argument("--output", type=Path, help="also write the markdown table here")
    p.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(","))
    with tempfile.TemporaryDirectory(prefix="zqlexical") as tmp:
        corpus = Path(tmp, "corpus.pickle")
        write_corpus(corpus, sizes[-1])
        base = extract(args.base, Path(tmp, "base"))
        versions = [Version("base", base, corpus), Version("head", ROOT, corpus)]
        try:
            rows = []
            for notes in sizes:
                rows.append(measure(versions, notes))
                sys.stderr.write(json.dumps(rows[-1]) + "\n")
        finally:
            for v in versions:
                v.close()
    markdown = report(rows, args.base)
    sys.stdout.write(markdown)
    if args.output:
        args.output.write_text(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
