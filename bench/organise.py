"""Organisation with the LLM judge off and on: does a slow LLM move store() or search()?

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/organise.py`` (about a minute
with the defaults; it reuses the tests' loopback chat server). Uses the Redis at ``--redis``
(default ``redis://127.0.0.1:6379/6``) under a key prefix of its own and deletes its keys
afterwards (it never flushes the database).

Two runs, one per mode, each with one real ``zettelq worker`` process:

- ``off``: ``ZQ_JUDGE=heuristic``, the default.
- ``llm``: ``ZQ_JUDGE=llm`` against an OpenAI-compatible chat server this script starts on
  127.0.0.1, which answers every call after ``--delay-ms`` (200 ms) by linking each new note
  to its first candidate. A second process runs the periodic ``judge`` job
  (``run_periodic(ctx, "judge")``) back to back, with ``--llm-concurrency`` calls in flight
  (1 by default: 8 notes per 200 ms call, 40 notes/s, below the store rate), so an LLM backlog
  (notes waiting on ``Keys.judge``) builds up while the producers run and drains afterwards.

In both, a load phase: ``--producers`` processes each store notes at a fixed pace
(``--rate`` notes/s in all, round-robin over ``--namespaces``) for ``--seconds`` while a second
thread searches them ``--search-rate`` times a second, alternately with ``fresh=True`` (read
your writes: the search waits until the worker has organised every earlier store) and
``fresh=False`` (the query alone). Then a burst phase:
``--burst`` notes stored at once (``store_many``), timed until the inbox is empty (organised
notes/s) and until the judge queue is empty (judged notes/s: the LLM judge's throughput).
Reported: store() and search() latency p50/p99 of the load phase, the largest judge backlog
seen and the one left when the producers stopped, the burst throughputs, and the LLM calls and
tokens per organised note over both phases, from the namespaces' stats. Tokens are the
loopback server's estimate (characters / 4), as it has no tokenizer.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from producer import MemoryClient, ProducerSettings, ZettelqError
from tests.integration.chat_server import ChatServer, Scripted
from worker.context import WorkerContext
from worker.organise.periodic import run_periodic
from worker.settings import WorkerSettings

TOPICS = "billing invoices postgres archive customer email refund ledger".split()
DETAILS = "nightly weekly region tenant audit schema backup replica retention quota".split()
CANDIDATE = re.compile(r"^\[(\d+)\] ", re.MULTILINE)

log = logging.getLogger("bench.organise")


@dataclass
class Produced:
    stores_s: list[float] = field(default_factory=list)
    searches_s: list[float] = field(default_factory=list)  #: fresh=True
    stale_searches_s: list[float] = field(default_factory=list)  #: fresh=False
    errors: Counter[str] = field(default_factory=Counter)


def note_text(i: int) -> str:
    a, b = TOPICS[i % len(TOPICS)], TOPICS[(i * 3 + 1) % len(TOPICS)]
    return f"The {a} service keeps {b} data with a {DETAILS[i % len(DETAILS)]} job, item {i}."


def _paced(rate: float, deadline: float) -> Any:
    """Yield 0, 1, 2, ... at ``rate`` per second until ``deadline`` (monotonic)."""
    start, i = time.monotonic(), 0
    while (now := time.monotonic()) < deadline:
        due = start + i / rate
        if due > now:
            time.sleep(due - now)
        yield i
        i += 1


def produce(url: str, prefix: str, namespaces: list[str], args: dict[str, Any], who: int) -> Any:
    """A producer process: stores at its share of the rate, searches from a second thread."""
    settings = ProducerSettings(redis_url=url, key_prefix=prefix, reply_timeout_s=30)
    out = Produced()
    deadline = time.monotonic() + args["seconds"]
    with MemoryClient(settings) as mem:

        def search() -> None:
            for i in _paced(args["search_rate"], deadline):
                started = time.perf_counter()
                fresh = i % 2 == 0
                try:
                    ns = namespaces[i // 2 % len(namespaces)]
                    mem.search(note_text(i), namespace=ns, k=5, fresh=fresh)
                    took = time.perf_counter() - started
                    (out.searches_s if fresh else out.stale_searches_s).append(took)
                except ZettelqError as exc:
                    out.errors[type(exc).__name__] += 1

        searcher = threading.Thread(target=search)
        searcher.start()
        for i in _paced(args["rate"] / args["producers"], deadline):
            n = i * args["producers"] + who
            started = time.perf_counter()
            try:
                mem.store(note_text(n), namespace=namespaces[n % len(namespaces)], agent=f"p{who}")
                out.stores_s.append(time.perf_counter() - started)
            except ZettelqError as exc:
                out.errors[type(exc).__name__] += 1
        searcher.join()
    return out


def judge_loop(settings: WorkerSettings, stop: Event) -> None:
    """What the periodic judge task does, back to back, until told to stop."""
    ctx = WorkerContext.build(settings)
    try:
        while not stop.is_set():
            if run_periodic(ctx, "judge") == 0:
                time.sleep(0.05)
    finally:
        ctx.close()


def loopback_llm(delay_s: float) -> ChatServer:
    """A chat server that links each new note to its first candidate, after ``delay_s``."""

    def respond(request: dict[str, Any]) -> Scripted:
        prompt = request["messages"][1]["content"]
        firsts = [CANDIDATE.search(s) for s in prompt.split("\nNew note ")[1:]]
        links = [{"candidate": int(m.group(1)), "relation": "related"} for m in firsts if m]
        content = json.dumps({"links": links})
        size = sum(len(m["content"]) for m in request["messages"])
        return Scripted(
            content,
            delay_s=delay_s,
            tokens=(size + len(content)) // 4,
            prompt_tokens=size // 4,
            completion_tokens=len(content) // 4,
        )

    server = ChatServer()
    server.responder = respond
    return server.start()


def spawn_worker(settings: WorkerSettings) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ZQ_REDIS_URL": settings.redis_url,
        "ZQ_KEY_PREFIX": settings.key_prefix,
        "ZQ_INDEX_DIR": str(settings.index_dir),
        "ZQ_JUDGE": settings.judge,
        "ZQ_LLM_URL": settings.llm_url or "",
    }
    if settings.llm_url is None:
        env.pop("ZQ_LLM_URL")
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def backlogs(ctx: WorkerContext, namespaces: list[str]) -> tuple[int, int]:
    """(notes waiting in the inbox, notes waiting for the LLM judge)."""
    pipe = ctx.redis.pipeline(transaction=False)
    for shard in range(ctx.keys.shard_count):
        pipe.xlen(ctx.keys.inbox(shard))
    for ns in namespaces:
        pipe.llen(ctx.keys.judge(ns))
    counts = [int(n) for n in pipe.execute()]
    return sum(counts[: ctx.keys.shard_count]), sum(counts[ctx.keys.shard_count :])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(int(len(ordered) * q), len(ordered) - 1)] * 1000, 2)


def run(mode: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prefix = f"bench-org-{mode}-{uuid.uuid4().hex[:6]}"
    llm = loopback_llm(args.delay_ms / 1000) if mode == "llm" else None
    settings = WorkerSettings(
        redis_url=args.redis,
        key_prefix=prefix,
        index_dir=tmp / prefix,
        judge="llm" if llm else "heuristic",
        llm_url=llm.url if llm else None,
        llm_max_concurrent=args.llm_concurrency,
        judge_max_wait_s=1.0,  # the last partial groups do not hold the end of a phase up
    )
    namespaces = [f"org-{i}" for i in range(args.namespaces)]
    ctx = WorkerContext.build(settings)
    worker = spawn_worker(settings)
    stop = mp.Event()
    judge = mp.Process(target=judge_loop, args=(settings, stop)) if llm else None
    try:
        with MemoryClient(settings) as mem:
            mem.flush(namespaces[0], timeout_s=60)  # the worker is up and serving
        if judge:
            judge.start()
        return measure(ctx, args, namespaces) | {"mode": mode}
    finally:
        stop.set()
        if judge:
            judge.join(30)
        stop_worker(worker)
        if llm:
            llm.stop()
        deleted = cleanup(ctx, prefix)
        ctx.close()
        log.info("%s: deleted %d keys under %s", mode, deleted, prefix)


def measure(ctx: WorkerContext, args: argparse.Namespace, namespaces: list[str]) -> dict[str, Any]:
    """The load phase (paced producers), then the burst phase (organisation capacity)."""
    most_waiting = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            most_waiting[0] = max(most_waiting[0], backlogs(ctx, namespaces)[1])

    sampler = threading.Thread(target=sample)
    sampler.start()
    shared = {k: getattr(args, k) for k in ("seconds", "rate", "producers", "search_rate")}
    jobs = [
        (ctx.settings.redis_url, ctx.settings.key_prefix, namespaces, shared, p)
        for p in range(args.producers)
    ]
    with mp.Pool(args.producers) as pool:
        results: list[Produced] = pool.starmap(produce, jobs)
    waiting_at_end = backlogs(ctx, namespaces)[1]
    done.set()
    sampler.join()
    while any(backlogs(ctx, namespaces)):
        time.sleep(0.05)
    stores = [x for r in results for x in r.stores_s]
    searches = [x for r in results for x in r.searches_s]
    stale = [x for r in results for x in r.stale_searches_s]
    organised_s, judged_s = burst(ctx, args.burst, namespaces)
    counters = totals(ctx, namespaces)
    n = len(stores) + args.burst
    return {
        "stored": len(stores),
        "store p50 ms": pct(stores, 0.5),
        "store p99 ms": pct(stores, 0.99),
        "searches": len(searches),
        "search p50 ms": pct(searches, 0.5),
        "search p99 ms": pct(searches, 0.99),
        "fresh=False search p50 ms": pct(stale, 0.5),
        "fresh=False search p99 ms": pct(stale, 0.99),
        "largest judge backlog": most_waiting[0],
        "judge backlog at end of load": waiting_at_end,
        "burst organised/s": round(args.burst / organised_s),
        "burst judged/s": round(args.burst / judged_s) if counters["judge_notes"] else None,
        "judged": counters["judge_notes"],
        "llm calls/note": round(counters["llm_calls"] / n, 3),
        "prompt tokens/note": round(counters["llm_prompt_tokens"] / n, 1),
        "completion tokens/note": round(counters["llm_completion_tokens"] / n, 1),
        "judge fallbacks": counters["judge_fallbacks"],
        "errors": dict(sum((r.errors for r in results), Counter())),
    }


def burst(ctx: WorkerContext, count: int, namespaces: list[str]) -> tuple[float, float]:
    """Store ``count`` notes at once; seconds until all are organised, and until all are
    judged (the same when the judge is off)."""
    started = time.monotonic()
    with MemoryClient(ctx.settings) as mem:
        for offset in range(0, count, 1000):
            chunk = range(offset, min(offset + 1000, count))
            for k, ns in enumerate(namespaces):
                texts = [note_text(10**6 + i) for i in chunk if i % len(namespaces) == k]
                mem.store_many(texts, namespace=ns)
    while backlogs(ctx, namespaces)[0]:
        time.sleep(0.02)
    organised_s = time.monotonic() - started
    while backlogs(ctx, namespaces)[1]:
        time.sleep(0.02)
    return organised_s, time.monotonic() - started


def totals(ctx: WorkerContext, namespaces: list[str]) -> Counter[str]:
    names = (
        "judge_notes",
        "judge_fallbacks",
        "llm_calls",
        "llm_prompt_tokens",
        "llm_completion_tokens",
    )
    out: Counter[str] = Counter()
    for ns in namespaces:
        values = ctx.redis.hmget(ctx.keys.stats(ns), list(names))
        out.update({k: int(v or 0) for k, v in zip(names, values, strict=True)})
    return out


def cleanup(ctx: WorkerContext, prefix: str) -> int:
    """Delete every key of the run: the data keys and Celery's queues under the prefix, and
    kombu's shared deadline key once no other queue binding is left in the database."""
    keys = [k for pattern in (f"{prefix}:*", f"*{prefix}.*") for k in ctx.redis.scan_iter(pattern)]
    for start in range(0, len(keys), 500):
        ctx.redis.delete(*keys[start : start + 500])
    if next(ctx.redis.scan_iter("_kombu.binding.*"), None) is None:
        keys.append(b"_kombu.binding_deadlines")
        ctx.redis.delete(keys[-1])
    return len(keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/6")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=60.0, help="notes stored per second")
    parser.add_argument("--search-rate", type=float, default=10.0, help="per producer")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--llm-concurrency", type=int, default=1)
    parser.add_argument("--burst", type=int, default=2000, help="notes stored at once, after")
    parser.add_argument("--modes", default="off,llm")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every mode, alternating")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="zq-organise-") as tmp:
        modes = args.modes.split(",") * args.repeat
        rows = [run(mode, args, Path(tmp)) for mode in modes]
    log.info("%s", json.dumps(rows, indent=2))
    log.info("cpus=%d %s", os.cpu_count() or 0, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
