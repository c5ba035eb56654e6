"""The ``zettelq`` command: run workers, beat and a dev stack; store, search and inspect.

zettelq dev                 embedded Redis (when none answers; data in var/redis) + worker + beat;
                            Ctrl-C stops all
zettelq worker [ARGS]       a Celery worker on the zettelq queues (ARGS go to celery)
zettelq searcher            a search-only process (no Celery): serves searches until stopped
zettelq beat [ARGS]         the beat scheduler (one leader at a time; standbys wait)
zettelq demo                store example memories, search, walk links (starts its own worker)
zettelq store TEXT          queue a note; prints its id
zettelq search QUERY        print the best hits
zettelq get ID | stats | flush
zettelq dead list|retry|purge
zettelq reembed NAMESPACE   re-embed notes written by another embedder (--wait: here, now)
zettelq organise NAMESPACE  run every periodic job now for one namespace, on a worker
zettelq runs                the last beat run of each periodic job (over all namespaces)
zettelq proposals list|accept|reject|revert [ID]   review evolution proposals
zettelq migrate             convert links stored before 2026-12-01 (every worker stopped)
zettelq check [-n NS|--all] check that notes and links are consistent (exit 1 if not)
zettelq health [--role R] [--host H]   exit 0 when a matching process is alive (healthchecks)
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from producer import Conflict, MemoryClient, NotFound
from producer.proposals import STATUSES
from worker import health
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    if rest and args.command not in ("worker", "beat"):
        _parser().error(f"unrecognised arguments: {' '.join(rest)}")
    if args.command not in ("worker", "beat"):  # Celery configures its own logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = WorkerSettings()
    handler = COMMANDS[args.command]
    return int(handler(settings, args, rest) or 0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zettelq", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="embedded Redis + worker + beat, stopped together on Ctrl-C")
    dev.add_argument(
        "--data-dir",
        default="var/redis",
        help="where the embedded Redis keeps its data (AOF) across restarts (default: %(default)s)",
    )
    dev.add_argument(
        "--ephemeral", action="store_true", help="the embedded Redis keeps nothing on disk"
    )
    sub.add_parser("worker", help="run a Celery worker (extra arguments go to celery)")
    sub.add_parser("beat", help="run the beat scheduler (one leader; others stand by)")
    sub.add_parser("searcher", help="serve searches only (no Celery), until SIGTERM or Ctrl-C")
    sub.add_parser("demo", help="store example memories, search them and walk their links")
    store = sub.add_parser("store", help="queue one note and print its id")
    store.add_argument("text")
    store.add_argument("--agent")
    store.add_argument("--tag", action="append", dest="tags")
    store.add_argument("--id")
    search = sub.add_parser("search", help="print the best hits for a query")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--json", action="store_true")
    get = sub.add_parser("get", help="print one note as JSON")
    get.add_argument("id")
    sub.add_parser("stats", help="print a namespace's counters as JSON")
    sub.add_parser("flush", help="wait until everything queued so far is organised")
    reembed = sub.add_parser("reembed", help="re-embed a namespace with the configured embedder")
    reembed.add_argument("namespace")
    reembed.add_argument("--wait", action="store_true", help="run it in this process and wait")
    organise = sub.add_parser("organise", help="run every periodic job now for one namespace")
    organise.add_argument("namespace")
    organise.add_argument("--jobs", help="comma-separated job names (default: all)")
    organise.add_argument("--timeout", type=float, default=None, help="seconds to wait")
    organise.add_argument("--no-wait", action="store_true", help="queue it and return")
    organise.add_argument("--json", action="store_true")
    sub.add_parser("runs", help="print the last beat run of each periodic job as JSON lines")
    sub.add_parser(
        "migrate", help="convert links stored before 2026-12-01 (stop every worker first)"
    )
    check = sub.add_parser("check", help="check a namespace's notes and links are consistent")
    check.add_argument("--all", action="store_true", help="every namespace")
    dead = sub.add_parser("dead", help="inspect or replay dead-lettered jobs")
    dead.add_argument("action", choices=["list", "retry", "purge"])
    dead.add_argument("--count", type=int, default=20)
    proposals = sub.add_parser(
        "proposals", help="list, accept, reject or revert evolution proposals"
    )
    proposals.add_argument("action", choices=["list", "accept", "reject", "revert"])
    proposals.add_argument("id", nargs="?", help="the proposal (accept, reject, revert)")
    proposals.add_argument("--status", choices=STATUSES)
    proposals.add_argument("--limit", type=int, default=20)
    health.add_parser(sub)
    for sp in (store, search, get, proposals, check, *_namespaced(sub)):
        sp.add_argument("-n", "--namespace", default=None)
    return p


def _namespaced(sub: Any) -> list[argparse.ArgumentParser]:
    return [sub.choices["stats"], sub.choices["flush"]]


def _worker(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.celery_app import INGEST_QUEUE, MAINT_QUEUE, app

    app.worker_main(["worker", "-Q", f"{INGEST_QUEUE},{MAINT_QUEUE}", *rest])
    return 0


def _searcher(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.context import WorkerContext
    from worker.heartbeat import ProcessHeartbeat
    from worker.server import SearchServer
    from worker.snapshot import Snapshotter

    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    ctx = WorkerContext.build(settings)
    server = SearchServer(ctx, settings.search_threads).start()
    snapshotter = Snapshotter(ctx).start()
    heartbeat = ProcessHeartbeat(settings, "searcher", consumer=ctx.consumer).start()
    log.info("zettelq searcher ready: threads=%d", settings.search_threads)
    stopped.wait()
    heartbeat.stop()
    snapshotter.stop()
    server.stop()
    ctx.close()
    return 0


def _beat(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.celery_app import app

    app.start(["beat", *rest])
    return 0


def spawn(command: str, *extra: str, quiet: bool = False) -> subprocess.Popen[bytes]:
    """Start ``zettelq COMMAND`` as a child process with this environment."""
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen([sys.executable, "-m", "worker.cli", command, *extra], stdout=out)


def stop(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 15.0) -> None:
    """SIGTERM (Celery's warm shutdown), then SIGKILL whatever is still running."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _dev(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.devserver import ensure_redis

    embedded = ensure_redis(settings.redis_url, None if args.ephemeral else args.data_dir)
    if embedded is not None:
        kept = "nothing on disk" if args.ephemeral else f"its data in {args.data_dir}"
        log.info("started an embedded Redis at %s; it keeps %s", embedded.url, kept)
    procs = [spawn("worker", "--loglevel=INFO"), spawn("beat", "--loglevel=INFO")]
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        log.info("stopping worker, beat%s", " and the embedded Redis" if embedded else "")
        stop(procs)
        if embedded is not None:
            embedded.stop()
    return 0


def _demo(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.demo import run_demo

    worker = spawn("worker", "--loglevel=WARNING", quiet=True)
    try:
        return run_demo(settings)
    finally:
        stop([worker])


def _store(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        nid = mem.store(
            args.text, namespace=args.namespace, agent=args.agent, tags=args.tags, id=args.id
        )
    _out(nid)
    return 0


def _search(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        hits = mem.search(args.query, namespace=args.namespace, k=args.k)
    if args.json:
        _out(json.dumps([h.model_dump() for h in hits], indent=2))
    for h in [] if args.json else hits:
        _out(f"{h.score:.3f}  {h.id}  {h.content}")
    return 0


def _get(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        _out(mem.get(args.id, namespace=args.namespace).model_dump_json(indent=2))
    return 0


def _stats(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        _out(mem.stats(args.namespace).model_dump_json(indent=2))
    return 0


def _flush(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        mem.flush(args.namespace)
    return 0


def _reembed(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    if not args.wait:
        from worker.tasks import send_reembed

        send_reembed(args.namespace)
        _out(f"queued zq.reembed of {args.namespace}")
        return 0
    from worker.context import WorkerContext
    from worker.reembed import reembed_namespace

    ctx = WorkerContext.build(settings)
    try:
        _out(f"reembedded {reembed_namespace(ctx, args.namespace)} notes")
    finally:
        ctx.close()
    return 0


def _organise(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    jobs = [j.strip() for j in args.jobs.split(",")] if args.jobs else None
    with MemoryClient(settings) as mem:
        done = mem.organise(
            args.namespace, wait=not args.no_wait, timeout_s=args.timeout, jobs=jobs
        )
    if args.json:
        _out(done.model_dump_json(indent=2))
    elif not done.done:
        _out(f"queued organise of {done.namespace} (job {done.job_id})")
    for run in [] if args.json else done.runs:
        _out(f"{run.job:<12} work={run.work:<8} {run.seconds * 1000:.1f} ms")
    return 0


def _runs(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.context import WorkerContext
    from worker.periodic import last_runs

    ctx = WorkerContext.build(settings)
    try:
        for run in last_runs(ctx).values():
            _out(run.model_dump_json())
    finally:
        ctx.close()
    return 0


def _dead(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker import deadletter
    from worker.context import WorkerContext

    ctx = WorkerContext.build(settings)
    try:
        if args.action == "list":
            for row in deadletter.list_dead(ctx, args.count):
                _out(json.dumps(row))
        elif args.action == "retry":
            _out(f"requeued {deadletter.retry_dead(ctx, args.count)}")
        else:
            _out(f"purged {deadletter.purge_dead(ctx)}")
    finally:
        ctx.close()
    return 0


def _check(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from producer.validation import check_namespace as valid_namespace
    from worker.context import WorkerContext
    from worker.integrity import check_namespace

    ctx = WorkerContext.build(settings)
    try:
        if args.all:
            names = sorted(m.decode() for m in ctx.redis.smembers(ctx.keys.namespaces()))
        else:
            names = [valid_namespace(args.namespace or settings.default_namespace)]
        bad = 0
        for ns in names:
            problems = check_namespace(ctx, ns)
            bad += bool(problems)
            _out(json.dumps({"namespace": ns, "problems": problems}))
    finally:
        ctx.close()
    return 1 if bad else 0


def _migrate(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.context import WorkerContext
    from worker.migrate import MigrationRefused, migrate_links

    ctx = WorkerContext.build(settings)
    try:
        done = migrate_links(ctx)
    except MigrationRefused as exc:
        sys.stderr.write(f"migrate refused: {exc}\n")
        return 1
    finally:
        ctx.close()
    _out(json.dumps(asdict(done)))
    return 0


def _proposals(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        if args.action == "list":
            for p in mem.proposals(args.namespace, status=args.status, limit=args.limit):
                _out(p.model_dump_json())
            return 0
        if args.id is None:
            _parser().error(f"proposals {args.action} needs a proposal id")
        step = {"accept": mem.accept, "reject": mem.reject, "revert": mem.revert}[args.action]
        try:
            _out(step(args.id, namespace=args.namespace, agent="cli").model_dump_json())
        except (Conflict, NotFound) as exc:
            sys.stderr.write(f"{args.action} refused: {exc}\n")
            return 1
    return 0


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


COMMANDS = {
    "dev": _dev,
    "worker": _worker,
    "beat": _beat,
    "searcher": _searcher,
    "demo": _demo,
    "store": _store,
    "search": _search,
    "get": _get,
    "stats": _stats,
    "flush": _flush,
    "dead": _dead,
    "reembed": _reembed,
    "organise": _organise,
    "runs": _runs,
    "proposals": _proposals,
    "migrate": _migrate,
    "check": _check,
    "health": health.run,
}


if __name__ == "__main__":
    sys.exit(main())
