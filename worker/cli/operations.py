"""The ``zettelq`` commands an operator uses on a worker host: dead, runs, check, reembed and
migrate. They read and write Redis directly; all but ``dead`` need the worker extra."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from producer import Unavailable
from worker.cli.console import Handler, Printer, add_output_options
from worker.cli.failure import redacted
from worker.connection import streams
from worker.settings import WorkerSettings

#: the columns of a dead letter's table row
DEAD_COLUMNS = ("dead_id", "at", "namespace", "shard", "reason", "payload_bytes")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    """Add this module's subcommands to ``sub``; return their handlers by name."""
    dead = sub.add_parser("dead", help="inspect or replay dead-lettered jobs")
    dead.add_argument("action", choices=["list", "retry", "purge"])
    dead.add_argument("--count", type=int, default=20)
    sub.add_parser("runs", help="print the last beat run of each periodic job")
    check = sub.add_parser("check", help="check a namespace's notes and links are consistent")
    check.add_argument("-n", "--namespace", default=None)
    check.add_argument("--all", action="store_true", help="every namespace")
    reembed = sub.add_parser("reembed", help="re-embed a namespace with the configured embedder")
    reembed.add_argument("namespace")
    reembed.add_argument("--wait", action="store_true", help="run it in this process and wait")
    sub.add_parser(
        "migrate", help="upgrade data of older builds: links, seq maps (stop every worker first)"
    )
    for name in HANDLERS:
        add_output_options(sub.choices[name])
    return HANDLERS


def _dead(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.intake import deadletter

    out = Printer.of(args)
    with streams(settings) as ctx:
        if args.action == "list":
            out.rows(deadletter.list_dead(ctx, args.count), DEAD_COLUMNS, "no dead letters")
        elif args.action == "retry":
            moved = deadletter.retry_dead(ctx, args.count)
            out.message(f"requeued {moved}", requeued=moved)
        else:
            purged = deadletter.purge_dead(ctx)
            out.message(f"purged {purged}", purged=purged)
    return 0


def _runs(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.context import WorkerContext
    from worker.organise.periodic import last_runs

    with WorkerContext.build(settings) as ctx:
        runs = [run.model_dump() for run in last_runs(ctx).values()]
    columns = ("job", "at", "namespaces", "left", "work", "seconds")
    Printer.of(args).rows(runs, columns, "no periodic job has run yet")
    return 0


def _check(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from producer.validation import check_namespace as valid_namespace
    from worker.context import WorkerContext
    from worker.store.integrity import check_namespace

    with WorkerContext.build(settings) as ctx:
        if args.all:
            names = sorted(m.decode() for m in ctx.redis.smembers(ctx.keys.namespaces()))
        else:
            names = [valid_namespace(args.namespace or settings.default_namespace)]
        rows = [{"namespace": ns, "problems": check_namespace(ctx, ns)} for ns in names]
    Printer.of(args).rows(rows, ("namespace", "problems"), "no namespaces")
    return 1 if any(row["problems"] for row in rows) else 0


def _reembed(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    out = Printer.of(args)
    if not args.wait:
        _send_reembed(settings, args.namespace)
        out.message(f"queued zq.reembed of {args.namespace}", namespace=args.namespace)
        return 0
    from worker.context import WorkerContext
    from worker.organise.reembed import reembed_namespace

    with WorkerContext.build(settings) as ctx:
        done = reembed_namespace(ctx, args.namespace)
    out.message(f"reembedded {done} notes", namespace=args.namespace, reembedded=done)
    return 0


def _send_reembed(settings: WorkerSettings, namespace: str) -> None:
    from kombu.exceptions import OperationalError

    from worker.runtime.tasks import send_reembed

    try:
        send_reembed(namespace)
    except OperationalError as exc:
        raise Unavailable(
            f"cannot reach the Celery broker at {redacted(settings.broker_source)} ({exc});"
            " is Redis running? `zettelq dev` starts one"
        ) from exc


def _migrate(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.context import WorkerContext
    from worker.store.migrate import migrate_links

    with WorkerContext.build(settings) as ctx:
        done = migrate_links(ctx)
    Printer.of(args).record(asdict(done))
    return 0


HANDLERS: dict[str, Handler] = {
    "dead": _dead,
    "runs": _runs,
    "check": _check,
    "reembed": _reembed,
    "migrate": _migrate,
}
