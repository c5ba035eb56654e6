"""The ``zettelq export`` and ``zettelq import`` commands (docs/transfer.md).

zettelq export NAMESPACE [--out PATH]           the namespace as JSONL (stdout by default)
zettelq import NAMESPACE [PATH|-] [--format F]  queue a file's notes; JSON summary on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from producer import InvalidInput, MemoryClient
from producer import validation as v
from worker.cli.console import Handler
from worker.settings import WorkerSettings


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    """Add this module's subcommands to ``sub``; return their handlers by name."""
    export = sub.add_parser("export", help="write a namespace as JSONL (backup, move out)")
    export.add_argument("namespace")
    export.add_argument("--out", help="file to write (default: stdout)")
    imp = sub.add_parser("import", help="queue the notes of a file (a zettelq export, ...)")
    imp.add_argument("namespace")
    imp.add_argument("path", nargs="?", default="-", help="the file (default: stdin)")
    imp.add_argument(
        "--format", default="auto", help="auto (the default), zettelq, jsonl, text or mem0"
    )
    imp.add_argument("--batch", type=int, default=500, help="lines per round trip")
    imp.add_argument(
        "--skip-errors", action="store_true", help="skip and count bad lines instead of stopping"
    )
    imp.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    imp.add_argument(
        "--wait", action="store_true", help="return once a worker has organised every note"
    )
    imp.add_argument("--timeout", type=float, default=None, help="seconds --wait waits")
    return {"export": _export, "import": _import}


def _export(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.connection import streams
    from worker.transfer.export import write_export

    ns = v.check_namespace(args.namespace)
    with streams(settings) as st:
        if args.out is None:
            write_export(st.redis, st.keys, ns, sys.stdout)
            return 0
        path = Path(args.out)
        tmp = path.with_name(path.name + ".part")
        with tmp.open("w", encoding="utf-8") as out:
            count = write_export(st.redis, st.keys, ns, out)
        os.replace(tmp, path)  # a file at PATH is always a whole export
    sys.stdout.write(json.dumps({"exported": count, "path": str(path)}) + "\n")
    return 0


def _import(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.transfer.importer import import_stream

    if args.batch < 1:
        raise InvalidInput("--batch must be at least 1")
    ns = v.check_namespace(args.namespace)
    show = not args.no_progress and sys.stderr.isatty()
    with _opened(args.path) as (stream, total), _progress(show, total) as advance:
        summary = import_stream(
            settings,
            ns,
            stream,
            fmt=args.format,
            batch=args.batch,
            skip_errors=args.skip_errors,
            advance=advance,
        )
    if args.wait and summary.imported:
        with MemoryClient(settings) as mem:
            mem.flush(ns, timeout_s=args.timeout)
    sys.stdout.write(json.dumps(summary.as_dict()) + "\n")
    if summary.failure is not None:
        raise summary.failure
    return 0


@contextmanager
def _opened(path: str) -> Iterator[tuple[IO[bytes], int | None]]:
    """The input as bytes, and its size when it is a file."""
    if path == "-":
        yield sys.stdin.buffer, None
        return
    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"no such file: {path}")
    with file.open("rb") as stream:
        yield stream, file.stat().st_size


@contextmanager
def _progress(show: bool, total: int | None) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr (bytes read of the file), or None when not shown."""
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("importing", total=total)
        yield lambda n: bar.advance(task, n)
