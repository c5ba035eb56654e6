"""``zettelq graph NAMESPACE``: write a namespace's notes and links as a self-contained HTML page
(``--html``), GraphML (``--graphml``) and Cytoscape.js JSON (``--cytoscape-json``). Reads Redis
directly (``--query`` asks a worker's search); needs the worker extra."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from producer import InvalidInput, MemoryClient
from producer import validation as v
from worker.cli.console import Handler, Printer, add_output_options
from worker.settings import WorkerSettings

DEFAULT_MAX_NODES = 500  #: notes shown when --max-nodes is not given
MAX_NODES = 20_000  #: the most notes one view may show
SEED_HOPS = 2  #: links followed from --seed when --hops is not given


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    """Add this module's subcommands to ``sub``; return their handlers by name."""
    graph = sub.add_parser(
        "graph", help="write a namespace's graph as an HTML page, GraphML or Cytoscape JSON"
    )
    graph.add_argument("namespace")
    graph.add_argument("--html", metavar="PATH", help="a self-contained page that opens offline")
    graph.add_argument("--graphml", metavar="PATH", help="GraphML (Gephi, yEd, networkx)")
    graph.add_argument("--cytoscape-json", metavar="PATH", help="Cytoscape.js JSON elements")
    chosen = graph.add_mutually_exclusive_group()
    chosen.add_argument("--seed", metavar="ID", help="this note and the notes near it")
    chosen.add_argument("--query", metavar="TEXT", help="the search hits and the notes near them")
    graph.add_argument(
        "--hops",
        type=int,
        default=None,
        help=f"links to follow from --seed (default {SEED_HOPS}) or --query (default 0), 0-5",
    )
    graph.add_argument(
        "--max-nodes",
        type=int,
        default=DEFAULT_MAX_NODES,
        help=f"notes shown at most, 1-{MAX_NODES} (default: %(default)s)",
    )
    add_output_options(graph)
    return {"graph": _graph}


def _graph(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    from worker.connection import streams
    from worker.explorer.export import to_cytoscape, to_graphml
    from worker.explorer.page import render_page
    from worker.explorer.view import MAX_HOPS, read_view, select

    renderers: dict[str, Callable[..., str]] = {
        "html": render_page,
        "graphml": to_graphml,
        "cytoscape_json": lambda view: json.dumps(to_cytoscape(view), ensure_ascii=False) + "\n",
    }
    outputs = {name: getattr(args, name) for name in renderers if getattr(args, name)}
    if not outputs:
        raise InvalidInput("graph needs at least one of --html, --graphml, --cytoscape-json")
    ns = v.check_namespace(args.namespace)
    max_nodes = v.check_int(args.max_nodes, "--max-nodes", 1, MAX_NODES)
    hops = _hops(args, MAX_HOPS)
    with MemoryClient(settings) as mem, streams(settings) as st:
        selection = select(
            mem, st, ns, seed=args.seed, query=args.query, hops=hops, max_nodes=max_nodes
        )
        view = read_view(st, ns, selection)
    for name, path in outputs.items():
        write_file(Path(path), renderers[name](view))
    nodes, edges = len(view.nodes), len(view.edges)
    text = f"wrote {nodes} notes and {edges} links of {ns} to {', '.join(outputs.values())}"
    Printer.of(args).message(
        text, namespace=ns, nodes=nodes, edges=edges, files=list(outputs.values()), **view.selection
    )
    return 0


def _hops(args: argparse.Namespace, most: int) -> int:
    if args.hops is None:
        return SEED_HOPS if args.seed is not None else 0
    if args.seed is None and args.query is None:
        raise InvalidInput("--hops needs --seed or --query")
    return v.check_int(args.hops, "--hops", 0, most)


def write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file beside it, renamed)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            os.fchmod(out.fileno(), 0o644)  # mkstemp's 0600 would hide it from others
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
