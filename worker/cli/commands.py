"""The ``zettelq`` commands an agent's developer uses: store, search, context, get, connected,
delete, stats, flush, organise and proposals. Each goes through a MemoryClient, so these work
on a base install (no celery, numpy or faiss)."""

from __future__ import annotations

import argparse
import logging

from producer import Conflict, InvalidInput, MemoryClient, NotFound
from producer.proposals import STATUSES
from worker.cli.console import Handler, Printer, add_output_options
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

#: the columns of a search hit's table row
HIT_COLUMNS = ("score", "id", "content")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    """Add this module's subcommands to ``sub``; return their handlers by name."""
    store = sub.add_parser("store", help="queue one note and print its id")
    store.add_argument("text")
    store.add_argument("--agent")
    store.add_argument("--tag", action="append", dest="tags")
    store.add_argument("--id")
    search = sub.add_parser("search", help="print the best hits for a query")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5)
    search.add_argument(
        "--min-relevance", type=float, default=0.0, help="only hits at least this relevant (0-1)"
    )
    context = sub.add_parser("context", help="print the token-budgeted text of the best hits")
    context.add_argument("query")
    context.add_argument("--max-tokens", type=int, default=2000)
    sub.add_parser("get", help="print one note").add_argument("id")
    connected = sub.add_parser("connected", help="print the notes linked to a note")
    connected.add_argument("id")
    connected.add_argument("--hops", type=int, default=2, help="links to follow (1-5)")
    sub.add_parser("delete", help="queue the deletion of a note").add_argument("id")
    sub.add_parser("stats", help="print a namespace's counters")
    sub.add_parser("flush", help="wait until everything queued so far is organised")
    _add_organise(sub)
    _add_proposals(sub)
    for name in HANDLERS:
        if name != "organise":  # names its namespace as an argument
            sub.choices[name].add_argument("-n", "--namespace", default=None)
        add_output_options(sub.choices[name])
    return HANDLERS


def _add_organise(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    organise = sub.add_parser("organise", help="run every periodic job now for one namespace")
    organise.add_argument("namespace")
    organise.add_argument("--jobs", help="comma-separated job names (default: all)")
    organise.add_argument("--timeout", type=float, default=None, help="seconds to wait")
    organise.add_argument("--no-wait", action="store_true", help="queue it and return")


def _add_proposals(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    proposals = sub.add_parser(
        "proposals", help="list, accept, reject or revert evolution proposals"
    )
    proposals.add_argument("action", choices=["list", "accept", "reject", "revert"])
    proposals.add_argument("id", nargs="?", help="the proposal (accept, reject, revert)")
    proposals.add_argument("--status", choices=STATUSES)
    proposals.add_argument("--limit", type=int, default=20)


def _store(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        nid = mem.store(
            args.text, namespace=args.namespace, agent=args.agent, tags=args.tags, id=args.id
        )
    Printer.of(args).message(nid, id=nid)
    return 0


def _search(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        hits = mem.search(
            args.query, namespace=args.namespace, k=args.k, min_relevance=args.min_relevance
        )
    Printer.of(args).rows((h.model_dump() for h in hits), HIT_COLUMNS, "no matches")
    return 0


def _context(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        text = mem.context(args.query, namespace=args.namespace, max_tokens=args.max_tokens)
    Printer.of(args).message(text or "no matches", text=text)
    return 0


def _get(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        Printer.of(args).record(mem.get(args.id, namespace=args.namespace).model_dump())
    return 0


def _connected(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        mem.get(args.id, namespace=args.namespace)  # NotFound for an unknown note
        found = mem.connected(args.id, namespace=args.namespace, max_hops=args.hops)
    columns = ("hop", "id", "weight", "label", "content")  # --json adds via
    Printer.of(args).rows((n.model_dump() for n in found), columns, "no linked notes")
    return 0


def _delete(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        ns = args.namespace or settings.default_namespace
        try:
            mem.get(args.id, namespace=ns)
        except NotFound:
            log.warning("no active note %r in namespace %r (yet); queued anyway", args.id, ns)
        mem.delete(args.id, namespace=ns)
    text = f"queued the deletion of {args.id} in namespace {ns}"
    Printer.of(args).message(text, id=args.id, namespace=ns, queued=True)
    return 0


def _stats(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        Printer.of(args).record(mem.stats(args.namespace).model_dump())
    return 0


def _flush(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    with MemoryClient(settings) as mem:
        mem.flush(args.namespace)
    ns = args.namespace or settings.default_namespace
    Printer.of(args).message(f"everything queued to {ns} is organised", namespace=ns, done=True)
    return 0


def _organise(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    jobs = [j.strip() for j in args.jobs.split(",")] if args.jobs else None
    with MemoryClient(settings) as mem:
        done = mem.organise(
            args.namespace, wait=not args.no_wait, timeout_s=args.timeout, jobs=jobs
        )
    out = Printer.of(args)
    if out.as_json:  # one line: done, job_id and the runs
        out.record(done.model_dump())
    elif not done.done:
        out.message(f"queued organise of {done.namespace} (job {done.job_id})")
    else:
        columns = ("job", "work", "seconds", "at")
        out.rows((r.model_dump() for r in done.runs), columns, f"no jobs ran on {done.namespace}")
    return 0


def _proposals(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    out = Printer.of(args)
    with MemoryClient(settings) as mem:
        if args.action == "list":
            found = mem.proposals(args.namespace, status=args.status, limit=args.limit)
            columns = ("id", "note", "status", "fields", "source", "created_at")
            out.rows((p.model_dump() for p in found), columns, "no proposals")
            return 0
        if args.id is None:
            raise InvalidInput(f"proposals {args.action} needs a proposal id")
        step = {"accept": mem.accept, "reject": mem.reject, "revert": mem.revert}[args.action]
        try:
            done = step(args.id, namespace=args.namespace, agent="cli")
        except (Conflict, NotFound) as exc:
            raise type(exc)(f"{args.action} refused: {exc}") from exc
        out.record(done.model_dump())
    return 0


HANDLERS: dict[str, Handler] = {
    "store": _store,
    "search": _search,
    "context": _context,
    "get": _get,
    "connected": _connected,
    "delete": _delete,
    "stats": _stats,
    "flush": _flush,
    "organise": _organise,
    "proposals": _proposals,
}
