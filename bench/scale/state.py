"""The million-note bench's state: its constants, what a run holds and found, the workers it
starts, and the reads of the namespace that every phase shares (see bench/million.py)."""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis import Redis

from bench.foundation import (
    Corpus,
    Latency,
    start_worker,
    stop_worker,
    worker_env,
)
from producer import MemoryClient, ReplyTimeout
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Snapshot:
    path: Path
    seconds: float  #: the snapshot run that wrote it (catch-up, copy and write)
    mib: float


def used_memory(r: Redis) -> int:
    return int(r.info("memory")["used_memory"])


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
