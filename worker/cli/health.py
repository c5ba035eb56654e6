"""``zettelq health [--role worker|searcher|beat] [--host HOST] [--json]``: is a process alive?

Reads the heartbeats of worker.runtime.heartbeat (no Celery, no broker round trip). Exits 0 and
prints the matching live processes when Redis answers and at least one matching process has a live
heartbeat in a healthy state; otherwise exits 1 and prints one line saying why. A container
healthcheck runs ``zettelq health --role worker --host "$HOSTNAME"``. A beat is healthy as leader
or standby (waiting for the lock): a beat container is healthy while its process runs, and
``zettelq health --role beat`` lists which beat leads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence

from redis.exceptions import RedisError

from producer.connection import data_redis
from producer.keys import Keys
from producer.settings import ProducerSettings
from worker.cli.console import Handler
from worker.cli.failure import redacted
from worker.readable import iso_time
from worker.runtime.heartbeat import ROLES, Process, live_processes
from worker.settings import WorkerSettings

HEALTHY_STATES = frozenset({"running", "leader", "standby"})  #: "stale": a wedged beat leader


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    """Add ``health`` to the ``zettelq`` subcommands; return its handler."""
    p = sub.add_parser("health", help="exit 0 when a matching process is alive (healthchecks)")
    p.add_argument("--role", choices=ROLES, help="only processes of this role")
    p.add_argument("--host", help="only processes on this host (as `hostname` prints it)")
    p.add_argument("--json", action="store_true", help="print the verdict and processes as JSON")
    return {"health": run}


def verdict(
    live: Sequence[Process], role: str | None, host: str | None
) -> tuple[list[Process], str | None]:
    """The matching live processes, and why the check fails (None when it passes)."""
    matching = [p for p in live if role in (None, p.role) and host in (None, p.host)]
    healthy = [p for p in matching if p.state in HEALTHY_STATES]
    what = f"{role or 'zettelq'} process" + (f" on host {host}" if host else "")
    if healthy:
        return matching, None
    if matching:
        states = ", ".join(sorted({p.state for p in matching}))
        return matching, f"no healthy {what}: state {states}"
    seen = Counter(p.role for p in live)
    elsewhere = ", ".join(f"{n} {r}" for r, n in sorted(seen.items())) or "none"
    return matching, f"no live {what} (live heartbeats: {elsewhere})"


def read_live(settings: ProducerSettings) -> list[Process]:
    """The live heartbeats in the settings' Redis (raises RedisError when it does not answer)."""
    keys = Keys.of(settings)
    r = data_redis(settings, socket_timeout=settings.socket_timeout_s)
    try:
        return live_processes(r, keys)
    finally:
        r.close()


def run(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    """The ``health`` command; its exit code."""
    matching, reason = check(settings, args.role, args.host)
    if args.json:
        rows = [_row(p) for p in matching]
        body = {"healthy": reason is None, "reason": reason, "processes": rows}
        sys.stdout.write(json.dumps(body) + "\n")
    elif reason is None:
        sys.stdout.write(_table(matching))
    else:
        sys.stderr.write(f"zettelq: unhealthy: {reason}\n")
    return 0 if reason is None else 1


def check(
    settings: ProducerSettings, role: str | None, host: str | None
) -> tuple[list[Process], str | None]:
    """``verdict`` over the live heartbeats, or the reason Redis could not be read."""
    try:
        live = read_live(settings)
    except RedisError as exc:
        return [], f"Redis at {redacted(settings.redis_url)} does not answer: {exc}"
    return verdict(live, role, host)


def _row(p: Process) -> dict[str, object]:
    return {
        "role": p.role,
        "host": p.host,
        "pid": p.pid,
        "state": p.state,
        "started": iso_time(p.started),
        "last_beat": iso_time(p.beat),
        "version": p.version,
        "consumer": p.consumer,
        "errors": p.errors,
    }


def _table(processes: Sequence[Process]) -> str:
    now = time.time()
    rows = [("ROLE", "HOST", "PID", "STATE", "STARTED", "LAST BEAT", "VERSION", "ERRORS")]
    rows += [
        (
            p.role,
            p.host,
            str(p.pid),
            p.state,
            iso_time(p.started),
            f"{now - p.beat:.1f}s ago",
            p.version,
            p.errors or "-",
        )
        for p in processes
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )
