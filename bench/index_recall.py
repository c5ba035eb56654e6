"""Measure VectorIndex HNSW recall@10 against the exact flat index, and single-query latency.

Run from the repo root: ``.venv/bin/python bench/index_recall.py`` (about a minute, one thread).

Data: 256-d vectors around random cluster centres (a centre has norm about 16) with isotropic
Gaussian noise, L2-normalised. Queries come from the same distribution and are not in the index.
"tight" clusters give nearest neighbours at cosine ~0.6, like related notes; "diffuse" ones are
close to uniform noise (top-1 cosine ~0.3), the hard case for any approximate index, and a
pessimistic bound: real embeddings have a low intrinsic dimension. Latency is per single-query
``VectorIndex.search`` call, including its input checks, as a worker sees it.
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import numpy.typing as npt

from worker.index import VectorIndex

log = logging.getLogger("bench.index_recall")

#: vector dimension
DIM = 256
#: results per query
K = 10
#: index sizes to measure
SIZES = (10_000, 100_000)
#: HNSW efSearch values to sweep
EF_SEARCHES = (32, 64, 96, 128)
#: queries used for recall, and the first few of them for latency
N_QUERIES, N_TIMED = 1000, 300
#: vectors per cluster
CLUSTER_SIZE = 100
#: per-dimension noise around a cluster centre, by data set name
NOISE = {"tight": 0.8, "diffuse": 2.5}
#: fraction of the index removed (below the 20% compaction point) for the filtered-search row
REMOVED_FRACTION = 0.15
#: efSearch for the filtered-search row (the VectorIndex default)
REMOVED_EF = 96


def clustered(n: int, noise: float, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    centres = rng.standard_normal((max(1, n // CLUSTER_SIZE), DIM)).astype(np.float32)
    x = centres[rng.integers(0, len(centres), n)]
    x += noise * rng.standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def build(vecs: npt.NDArray[np.float32], hnsw_threshold: int) -> tuple[VectorIndex, float]:
    index = VectorIndex(DIM, hnsw_threshold=hnsw_threshold)
    started = time.perf_counter()
    index.add(np.arange(len(vecs), dtype=np.int64), vecs)
    return index, time.perf_counter() - started


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


def report(row: str, found: float, index: VectorIndex, queries: npt.NDArray[np.float32]) -> None:
    p50, p95 = latency_ms(index, queries)
    log.info("%s  %9.3f  %8.3f  %8.3f", row, found, p50, p95)


def measure(data_set: str, n: int, rng: np.random.Generator) -> None:
    data = clustered(n + N_QUERIES, NOISE[data_set], rng)
    vecs, queries = data[:n], data[n:]
    flat, flat_s = build(vecs, hnsw_threshold=n)
    hnsw, hnsw_s = build(vecs, hnsw_threshold=0)
    row = f"{data_set:<8} {n:>7}"
    log.info("%s  build: flat %.2fs, hnsw %.1fs (%.0f vectors/s)", row, flat_s, hnsw_s, n / hnsw_s)
    truth = flat.search(queries, K)[1]
    report(f"{row}  {'flat':<14}", 1.0, flat, queries)
    for ef in EF_SEARCHES:
        hnsw.ef_search = ef
        found = recall(hnsw.search(queries, K)[1], truth)
        report(f"{row}  {f'hnsw ef={ef}':<14}", found, hnsw, queries)
    removed = rng.choice(n, int(REMOVED_FRACTION * n), replace=False).astype(np.int64)
    flat.remove(removed)
    hnsw.remove(removed)
    hnsw.ef_search = REMOVED_EF
    truth = flat.search(queries, K)[1]
    found = recall(hnsw.search(queries, K)[1], truth)
    report(f"{row}  {f'-{REMOVED_FRACTION:.0%} ef={REMOVED_EF}':<14}", found, hnsw, queries)


def main() -> None:
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    logging.getLogger("worker.index").setLevel(logging.WARNING)
    columns = ("data", "n", "index", "recall@10", "p50 ms", "p95 ms")
    log.info("%-8s %7s  %-14s  %9s  %8s  %8s", *columns)
    rng = np.random.default_rng(0)
    for data_set in NOISE:
        for n in SIZES:
            measure(data_set, n, rng)


if __name__ == "__main__":
    main()
