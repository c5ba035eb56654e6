"""Measure VectorIndex recall@10 of IVF and HNSW against the exact flat index, single-query
latency, and what ingest pays per batch (insert 256 vectors, then find each one's 11 nearest).

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/index_recall.py`` (a few minutes, one
thread); ``--data tight --sizes 1000000 --ann ivf`` for one data set, size and kind.

Data: 256-d vectors around random cluster centres (a centre has norm about 16) with isotropic
Gaussian noise, L2-normalised. Queries come from the same distribution and are not in the index.
"tight" clusters give nearest neighbours at cosine ~0.6, like related notes; "diffuse" ones are
close to uniform noise (top-1 cosine ~0.3), the hard case for any approximate index, and a
pessimistic bound: real embeddings have a low intrinsic dimension. "notes" are the synthetic
notes of ``foundation.py`` through the default hashing embedder (random words: top-1 cosine
~0.35, as hard as "diffuse"); "topics" its ``TopicalCorpus`` notes, each on one of 500 topics
whose words it mostly uses (notes on one topic at cosine ~0.33, others ~0.04). Latency is per
single-query ``VectorIndex.search`` call, including its input checks, as a worker sees it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from bench.foundation import corpus_of
from worker.index.vector import Ann, VectorIndex
from worker.models.hashing import HashingEmbedder

log = logging.getLogger("bench.index_recall")

#: vector dimension
DIM = 256
#: results per query
K = 10
#: index sizes to measure
SIZES = (10_000, 100_000)
#: HNSW efSearch and IVF nprobe values to sweep
EF_SEARCHES = (32, 64, 128)
NPROBES = (8, 16, 32, 64)
#: vectors per ingest batch (ZQ_BATCH_SIZE) and link candidates looked up per note (ZQ_LINK_K + 1)
BATCH, LINK_K = 256, 11
#: queries used for recall, and the first few of them for latency
N_QUERIES, N_TIMED = 1000, 300
#: vectors per cluster
CLUSTER_SIZE = 100
#: per-dimension noise around a cluster centre, by synthetic data set name
NOISE = {"tight": 0.8, "diffuse": 2.5}
DATA_SETS = (*NOISE, "notes", "topics")


def clustered(n: int, noise: float, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    centres = rng.standard_normal((max(1, n // CLUSTER_SIZE), DIM)).astype(np.float32)
    x: npt.NDArray[np.float32] = centres[rng.integers(0, len(centres), n)]
    x += noise * rng.standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def data(data_set: str, n: int, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    if data_set in NOISE:
        return clustered(n, NOISE[data_set], rng)
    kind = "topics" if data_set == "topics" else "words"
    corpus, embedder = corpus_of(kind, int(rng.integers(1 << 30))), HashingEmbedder(DIM)
    return embedder.embed([corpus.note() for _ in range(n)]).astype(np.float32)


def build(vecs: npt.NDArray[np.float32], threshold: int, ann: Ann) -> tuple[VectorIndex, float]:
    index = VectorIndex(DIM, ann_threshold=threshold, ann=ann)
    started = time.perf_counter()
    index.add(np.arange(len(vecs), dtype=np.int64), vecs)
    return index, time.perf_counter() - started


def ingest_ms(index: VectorIndex, batch: npt.NDArray[np.float32], first: int) -> float:
    """Insert one batch, then look up each new vector's link candidates: ingest's index work."""
    started = time.perf_counter()
    index.add(np.arange(first, first + len(batch), dtype=np.int64), batch)
    index.search(batch, LINK_K)
    elapsed = (time.perf_counter() - started) * 1000
    index.remove(np.arange(first, first + len(batch), dtype=np.int64))
    return elapsed


def recall(found: npt.NDArray[np.int64], truth: npt.NDArray[np.int64]) -> float:
    hits = sum(len(np.intersect1d(f, t[t >= 0])) for f, t in zip(found, truth, strict=True))
    return hits / float((truth >= 0).sum())


def latency_ms(index: VectorIndex, queries: npt.NDArray[np.float32]) -> tuple[float, float]:
    """Median and 95th percentile of single-query search time."""
    times = []
    for i in range(N_TIMED):
        started = time.perf_counter()
        index.search(queries[i : i + 1], K)
        times.append(time.perf_counter() - started)
    p50, p95 = np.percentile(times, [50, 95]) * 1000
    return float(p50), float(p95)


def report(
    row: str, found: float, index: VectorIndex, queries: npt.NDArray[np.float32], batch_ms: float
) -> None:
    p50, p95 = latency_ms(index, queries)
    log.info("%s  %9.3f  %8.3f  %8.3f  %9.1f", row, found, p50, p95, batch_ms)


def measure(data_set: str, n: int, rng: np.random.Generator, anns: Sequence[Ann]) -> None:
    vecs_all = data(data_set, n + N_QUERIES + BATCH, rng)
    vecs, queries, batch = vecs_all[:n], vecs_all[n : n + N_QUERIES], vecs_all[n + N_QUERIES :]
    row = f"{data_set:<8} {n:>7}"
    flat, _ = build(vecs, n + BATCH, "ivf")
    truth = flat.search(queries, K)[1]
    report(f"{row}  {'flat':<14}", 1.0, flat, queries, ingest_ms(flat, batch, n))
    sweeps: tuple[tuple[Ann, str, tuple[int, ...]], ...] = (
        ("ivf", "nprobe", NPROBES),
        ("hnsw", "ef_search", EF_SEARCHES),
    )
    for ann, knob, values in sweeps:
        if ann not in anns:
            continue
        index, built_s = build(vecs, 0, ann)
        log.info("%s  build %s: %.1fs (%.0f vectors/s)", row, ann, built_s, n / built_s)
        for value in values:
            setattr(index, knob, value)
            found = recall(index.search(queries, K)[1], truth)
            label = f"{ann} {'np' if ann == 'ivf' else 'ef'}={value}"
            report(f"{row}  {label:<14}", found, index, queries, ingest_ms(index, batch, n))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=",".join(DATA_SETS), help=f"of {', '.join(DATA_SETS)}")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="index sizes")
    p.add_argument("--ann", default="ivf,hnsw", help="approximate kinds to measure")
    args = p.parse_args()
    data_sets, anns = args.data.split(","), args.ann.split(",")
    if not set(data_sets) <= set(DATA_SETS) or not set(anns) <= {"ivf", "hnsw"}:
        p.error(f"--data takes {', '.join(DATA_SETS)}; --ann takes ivf, hnsw")
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    logging.getLogger("worker.index.vector").setLevel(logging.WARNING)
    columns = ("data", "n", "index", "recall@10", "p50 ms", "p95 ms", "batch ms")
    log.info("%-8s %7s  %-14s  %9s  %8s  %8s  %9s", *columns)
    rng = np.random.default_rng(0)
    for data_set in data_sets:
        for n in map(int, args.sizes.split(",")):
            measure(data_set, n, rng, cast(list[Ann], anns))


if __name__ == "__main__":
    main()
