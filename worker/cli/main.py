"""The ``zettelq`` command: run workers, beat and a dev stack; store, search and inspect.

zettelq dev                 embedded Redis (when none answers; data in var/redis) + worker + beat;
                            Ctrl-C stops all
zettelq worker [ARGS]       a Celery worker on the zettelq queues (ARGS go to celery)
zettelq searcher            a search-only process (no Celery): serves searches until stopped
zettelq beat [ARGS]         the beat scheduler (one leader at a time; standbys wait)
zettelq demo                store example memories, search, walk links (starts its own worker)
zettelq store TEXT          queue a note; prints its id
zettelq search QUERY        the best hits          zettelq context QUERY   their token-budgeted text
zettelq get ID              one note               zettelq connected ID    the notes linked to it
zettelq delete ID           queue its deletion     zettelq stats | flush   counters | wait for it
zettelq dead list|retry|purge
zettelq reembed NAMESPACE   re-embed notes written by another embedder (--wait: here, now)
zettelq organise NAMESPACE  run every periodic job now for one namespace, on a worker
zettelq runs                the last beat run of each periodic job (over all namespaces)
zettelq proposals list|accept|reject|revert [ID]   review evolution proposals
zettelq migrate             upgrade data of older builds (every worker stopped)
zettelq check [-n NS|--all] check that notes and links are consistent (exit 1 if not)
zettelq health [--role R] [--host H]   exit 0 when a matching process is alive (healthchecks)
zettelq top [-n NS]         a live view of shards, backlog, leases, searches, dead letters
zettelq graph NS --html PATH            one offline page of the notes and links (or --graphml PATH,
                                        --cytoscape-json PATH)
zettelq mcp [--http]        serve the memory tools to MCP clients (stdio, or streamable HTTP)
zettelq serve               the HTTP API        zettelq token create|list|revoke   its tokens
zettelq export NS           a namespace as JSONL  zettelq import NS FILE   restore or move in

Results print as a table, or with --json as one JSON object per line. An error is one line on
stderr (``zettelq: error: ...``) with exit code 1, or 2 for bad usage, input or settings (see
worker.cli.failure); --debug or ZQ_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from producer.core import redis_errors
from worker.cli import commands, health, operations, top
from worker.cli import graph as graph_command
from worker.cli import mcp as mcp_command
from worker.cli import serve as serve_cli
from worker.cli import transfer as transfer_cli
from worker.cli.console import Handler
from worker.cli.failure import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, describe
from worker.settings import WorkerSettings, warn_unknown_variables

log = logging.getLogger(__name__)

#: long-running commands that log at INFO with timestamps
PROCESSES = frozenset({"dev", "searcher"})
#: commands whose Celery configures its own logging and takes the arguments zettelq does not know
CELERY_COMMANDS = frozenset({"worker", "beat"})
#: values of ZQ_DEBUG that turn tracebacks on
TRUE = frozenset({"1", "true", "yes", "on"})
#: the -W filter that silences Celery's warning about a worker running as root
ROOT_WARNING = "ignore:You're running the worker with superuser privileges"
#: modules whose add_commands(sub) adds their subcommands and returns their handlers by name
COMMAND_MODULES = (
    commands,
    operations,
    health,
    top,
    graph_command,
    serve_cli,
    mcp_command,
    transfer_cli,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser, handlers = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in CELERY_COMMANDS:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    debug = getattr(args, "debug", False) or os.environ.get("ZQ_DEBUG", "").lower() in TRUE
    _configure_logging(args.command, debug)
    warn_unknown_variables(os.environ)
    return _run(handlers[args.command], args, rest, debug)


def _run(handler: Handler, args: argparse.Namespace, rest: list[str], debug: bool) -> int:
    """Run the command; an exception ends it with one line on stderr and its exit code."""
    settings: WorkerSettings | None = None
    try:
        settings = WorkerSettings()
        with redis_errors():
            code = int(handler(settings, args, rest) or 0)
        sys.stdout.flush()  # a closed pipe fails here, not at exit
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader left (`zettelq search x --json | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if debug:
            traceback.print_exc()
        failure = describe(exc, args.command, settings.redis_url if settings else None)
        sys.stderr.write(f"zettelq: error: {failure.message}\n")
        return failure.code


def _configure_logging(command: str, debug: bool) -> None:
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # "Could not load ... AVX512"
    if command in CELERY_COMMANDS:
        return
    if command in PROCESSES:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter("zettelq: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])


class _Formatter(logging.Formatter):
    """``zettelq: warning: ...``: the level in lower case, as argparse writes ``error``."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return self._style.format(record).replace(record.levelname, record.levelname.lower(), 1)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The parser, and the handler of each subcommand by name."""
    p = argparse.ArgumentParser(prog="zettelq", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"zettelq {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    handlers = _add_processes(sub)
    for module in COMMAND_MODULES:
        handlers.update(module.add_commands(sub))
    for parser in (p, *sub.choices.values()):  # before or after the subcommand
        parser.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="print the traceback of an error (also ZQ_DEBUG=1)",
        )
    return p, handlers


def _version() -> str:
    try:
        return version("zettelq")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _add_processes(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
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
    return {"dev": _dev, "worker": _worker, "beat": _beat, "searcher": _searcher, "demo": _demo}


def _worker(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    if settings.metrics_port:
        _share_metrics(settings)
    from worker.runtime.celery_app import INGEST_QUEUE, MAINT_QUEUE

    return _celery("worker", "-Q", f"{INGEST_QUEUE},{MAINT_QUEUE}", *rest)


def _share_metrics(settings: WorkerSettings) -> None:
    """Prometheus multiprocess mode for the prefork pool: PROMETHEUS_MULTIPROC_DIR names an empty
    folder before prometheus-client is imported (by worker.metrics); the children inherit it."""
    folder = Path(settings.metrics_dir or f"/tmp/zettelq-metrics-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)


def _searcher(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker import metrics
    from worker.context import WorkerContext
    from worker.runtime.heartbeat import ProcessHeartbeat
    from worker.runtime.redis_config import check_at_start
    from worker.runtime.servers import SearchServer
    from worker.runtime.snapshotter import Snapshotter

    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    ctx = WorkerContext.build(settings)
    ctx.redis.ping()  # a dead Redis is one error line now, not a retry loop
    check_at_start(ctx.redis)
    server = SearchServer(ctx, settings.search_threads).start()
    snapshotter = Snapshotter(ctx).start()
    heartbeat = ProcessHeartbeat(settings, "searcher", consumer=ctx.consumer).start()
    metrics.serve(settings)
    log.info(
        "zettelq searcher ready: threads=%d, switch interval %g ms",
        settings.search_threads,
        settings.switch_interval_ms,
    )
    stopped.wait()
    heartbeat.stop()
    snapshotter.stop()
    server.stop()
    ctx.close()
    return 0


def _beat(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    return _celery("beat", *rest)


def _celery(*argv: str) -> int:
    """Run ``celery ARGV`` on the zettelq app and return its exit code (app.start and
    app.worker_main drop it: a worker that refused its Redis would exit 0)."""
    from celery.bin.celery import celery

    return int(
        celery.main(["-A", "worker.runtime.celery_app:app", *argv], standalone_mode=False) or 0
    )


def spawn(
    command: str, *extra: str, quiet: bool = False, warnings: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """Start ``zettelq COMMAND`` as a child process with this environment; ``warnings`` are
    Python ``-W`` filters for it."""
    out = subprocess.DEVNULL if quiet else None
    options = [f"-W{w}" for w in warnings]
    argv = [sys.executable, *options, "-m", "worker.cli.main", command, *extra]
    return subprocess.Popen(argv, stdout=out)


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
    from worker.runtime.devserver import ensure_redis

    embedded = ensure_redis(settings.redis_url, None if args.ephemeral else args.data_dir)
    if embedded is not None:
        kept = "nothing on disk" if args.ephemeral else f"its data in {args.data_dir}"
        log.info("started an embedded Redis at %s; it keeps %s", embedded.url, kept)
    else:
        _require_supported(settings)  # the worker warns about its configuration
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
    from worker.cli.demo import run_demo

    _require_supported(settings)  # before a worker that would refuse it and leave us waiting
    # the demo's own worker: Celery's warning about running as root (as in many containers)
    # would be the loudest line of a newcomer's first run
    worker = spawn("worker", "--loglevel=WARNING", quiet=True, warnings=[ROOT_WARNING])
    try:
        return run_demo(settings)
    finally:
        stop([worker])


def _require_supported(settings: WorkerSettings) -> None:
    from producer.connection import data_redis
    from worker.runtime.redis_config import require_supported, servers

    with data_redis(settings) as r:
        for server in servers(r):
            require_supported(server)


if __name__ == "__main__":
    sys.exit(main())
