"""``zettelq top``: a live view of a deployment, read from Redis only (no worker is asked, so it
works while every worker is down, and says so).

Each frame shows the live processes (role, host, state, errors their threads survived), every
shard (backlog in its inbox, searches waiting on its list, the process holding its lease, jobs
organised per second since the last frame), the search servers (searches in their last minute
with p50/p99), dead letters, the periodic jobs' last runs and, with ``--namespace``, that
namespace's stats. ``--once`` prints one frame; ``--json`` prints frames as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from redis import Redis
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from producer.connection import data_redis
from producer.errors import InvalidInput
from producer.keys import Keys
from producer.validation import check_namespace
from worker.cli.console import Handler
from worker.cli.health import HEALTHY_STATES
from worker.readable import iso_time, readable
from worker.runtime.heartbeat import Process, live_processes
from worker.settings import WorkerSettings

#: the roles whose processes organise and search
SERVING = frozenset({"worker", "searcher"})


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    top = sub.add_parser("top", help="a live view: shards, backlog, leases, searches, dead letters")
    top.add_argument("-n", "--namespace", default=None, help="also show this namespace's stats")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--json", action="store_true", help="frames as JSON lines")
    return {"top": _top}


@dataclass
class Shard:
    shard: int
    backlog: int
    searches_waiting: int
    lease_holder: str | None
    jobs: int  #: inbox entries organised since the shard's counter began
    jobs_per_s: float | None = None


@dataclass
class Searcher:
    consumer: str
    searches: int  #: in the last minute
    p50_ms: float
    p99_ms: float


@dataclass
class Frame:
    """One reading of the deployment."""

    at: float
    processes: list[Process]
    shards: list[Shard]
    searchers: list[Searcher]
    dead: int
    runs: dict[str, dict[str, Any]]
    namespace: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


def read_frame(r: Redis, keys: Keys, namespace: str | None = None) -> Frame:
    """Everything a frame shows, in a few round trips."""
    pipe = r.pipeline(transaction=False)
    for shard in range(keys.shard_count):
        pipe.xlen(keys.inbox(shard))
        pipe.llen(keys.shard_search(shard))
        pipe.get(keys.lease(shard))
        pipe.hget(keys.shard_counters(shard), "jobs")
    pipe.xlen(keys.dead())
    pipe.hgetall(keys.runs())
    pipe.zrange(keys.searchers(), 0, -1)
    *per_shard, dead, runs, searchers = pipe.execute()
    shards = [
        Shard(
            shard=i,
            backlog=int(per_shard[4 * i]),
            searches_waiting=int(per_shard[4 * i + 1]),
            lease_holder=_holder(per_shard[4 * i + 2]),
            jobs=int(per_shard[4 * i + 3] or 0),
        )
        for i in range(keys.shard_count)
    ]
    frame = Frame(
        at=time.time(),
        processes=live_processes(r, keys),
        shards=shards,
        searchers=_searchers(r, keys, [c.decode(errors="replace") for c in searchers]),
        dead=int(dead),
        runs=_runs(runs),
    )
    if namespace is not None:
        frame.namespace = _namespace(r, keys, namespace)
    if not any(p.role in SERVING for p in frame.processes):
        frame.warnings.append(
            "no live worker or searcher process: nothing is organised and searches time out"
        )
    return frame


def _holder(token: bytes | None) -> str | None:
    return None if token is None else token.split(b"/")[0].decode(errors="replace")


def _searchers(r: Redis, keys: Keys, consumers: list[str]) -> list[Searcher]:
    pipe = r.pipeline(transaction=False)
    for consumer in consumers:
        pipe.hgetall(keys.search_stats(consumer))
    found = []
    for consumer, raw in zip(consumers, pipe.execute(), strict=True):
        if raw:  # lapsed ones are only in the index until pruned
            f = {k.decode(): _number(v) for k, v in raw.items()}
            found.append(
                Searcher(
                    consumer,
                    int(f.get("searches", 0)),
                    f.get("p50_ms", 0.0),
                    f.get("p99_ms", 0.0),
                )
            )
    return found


def _number(raw: bytes) -> float:
    try:
        return float(raw)
    except ValueError:  # what Redis holds is untrusted: show 0, not a crash
        return 0.0


def _runs(raw: Mapping[bytes, bytes]) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for job, value in sorted(raw.items()):
        try:
            run = json.loads(value)
        except ValueError:
            continue
        if isinstance(run, dict):
            runs[job.decode(errors="replace")] = run
    return runs


def _namespace(r: Redis, keys: Keys, ns: str) -> dict[str, Any]:
    pipe = r.pipeline(transaction=False)
    pipe.zcard(keys.active(ns))
    pipe.zcard(keys.tombstoned(ns))
    pipe.hgetall(keys.stats(ns))
    notes, tombstoned, stats = pipe.execute()
    fields = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in stats.items()}
    return {"namespace": ns, "notes": int(notes), "tombstoned": int(tombstoned), **fields}


def with_rates(frame: Frame, previous: Frame | None) -> Frame:
    """``frame`` with each shard's jobs/s since ``previous`` (None on the first frame)."""
    if previous is None or frame.at <= previous.at:
        return frame
    elapsed = frame.at - previous.at
    for now, then in zip(frame.shards, previous.shards, strict=True):
        now.jobs_per_s = max(0, now.jobs - then.jobs) / elapsed
    return frame


def render(frame: Frame) -> Group:
    """The frame as tables for a terminal."""
    parts: list[Any] = [Text(f"zettelq top  {iso_time(frame.at)}", style="bold")]
    parts += [Text(w, style="bold red") for w in frame.warnings]
    procs = Table("role", "host", "pid", "state", "errors", title="processes", title_justify="left")
    for p in frame.processes:
        style = "" if p.state in HEALTHY_STATES else "red"
        procs.add_row(p.role, p.host, str(p.pid), Text(p.state, style=style), p.errors or "-")
    shards = Table(
        "shard", "backlog", "searches waiting", "lease holder", "jobs/s", "jobs",
        title="shards", title_justify="left",
    )  # fmt: skip
    for s in frame.shards:
        rate = "-" if s.jobs_per_s is None else f"{s.jobs_per_s:,.0f}"
        shards.add_row(
            str(s.shard), f"{s.backlog:,}", str(s.searches_waiting), s.lease_holder or "-",
            rate, f"{s.jobs:,}",
        )  # fmt: skip
    searchers = Table(
        "search server", "searches/min", "p50 ms", "p99 ms", title="searches", title_justify="left"
    )
    for q in frame.searchers:
        searchers.add_row(q.consumer, str(q.searches), f"{q.p50_ms:.2f}", f"{q.p99_ms:.2f}")
    parts += [procs, shards, searchers, Text(f"dead letters: {frame.dead:,}")]
    runs = Table("job", "last run", "namespaces", "left", "work", "seconds", title="periodic jobs")
    for job, run in frame.runs.items():
        at = run.get("at")
        runs.add_row(
            job,
            iso_time(at) if isinstance(at, int | float) else "?",
            *(str(run.get(k, "")) for k in ("namespaces", "left", "work")),
            f"{run.get('seconds', 0):.2f}" if isinstance(run.get("seconds"), float) else "",
        )
    parts.append(runs)
    if frame.namespace is not None:
        ns = Table("field", "value", title=f"namespace {frame.namespace['namespace']}")
        for key, value in frame.namespace.items():
            ns.add_row(key, str(value))
        parts.append(ns)
    return Group(*parts)


def as_json(frame: Frame) -> str:
    data = asdict(frame)
    data["processes"] = [asdict(p) for p in frame.processes]
    return json.dumps(readable(data))


def frames(r: Redis, keys: Keys, namespace: str | None, interval_s: float) -> Iterator[Frame]:
    """A frame now, then one every ``interval_s``, each with its shards' rates."""
    previous = None
    while True:
        frame = with_rates(read_frame(r, keys, namespace), previous)
        yield frame
        previous = frame
        time.sleep(interval_s)


def _top(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    if not args.interval > 0:
        raise InvalidInput("--interval must be a number of seconds > 0")
    if args.namespace is not None:
        check_namespace(args.namespace)
    keys = Keys.of(settings)
    r = data_redis(settings)
    try:
        shown = frames(r, keys, args.namespace, args.interval)
        if args.json:
            for frame in shown:
                print(as_json(frame), flush=True)
                if args.once:
                    break
        elif args.once:
            Console().print(render(next(shown)))
        else:
            with Live(auto_refresh=False) as live:
                for frame in shown:
                    live.update(render(frame), refresh=True)
    finally:
        r.close()
    return 0
