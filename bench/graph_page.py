"""The graph explorer at size: how long ``zettelq graph`` takes to read and write a view of N
notes, and how long the page takes to draw it in headless Chromium.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/graph_page.py`` (needs the dev
extra and ``apt-get install chromium``; about a minute at the default sizes). It starts an
embedded Redis of its own (worker.runtime.devserver), stores ``--sizes`` notes per namespace (the
foundation benchmark's seeded corpus), organises them in this process (``drain_shard``, as the
tests do), then for each size, ``--repeat`` times:

- **direct client**: ``MemoryClient.get()`` of every note the view shows, one round trip each:
  the baseline a reader of those notes pays without the explorer;
- **select + read**: ``select`` (most connected, ``max_nodes`` = the size) and ``read_view``
  (notes, links, audit history);
- **html / graphml / cytoscape json**: ``render_page``, ``to_graphml``, ``to_cytoscape`` plus
  ``json.dumps`` (what the command writes), and the size of each;
- **browser**: Chromium opens the page from ``file://`` until the layout has stopped
  (``data-zq-ready``); reported both as the wall time of ``goto`` + wait and as the page's own
  ``zqRenderMs`` (script start to layout stop).

Medians of the repeats are printed as a markdown table; the ratio column is the export
(select + read + the three writers) over the direct client's reads.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.foundation import Corpus
from producer import MemoryClient
from worker.connection import Streams
from worker.context import WorkerContext
from worker.explorer.export import to_cytoscape, to_graphml
from worker.explorer.page import render_page
from worker.explorer.view import GraphView, read_view, select
from worker.intake.drain import drain_shard
from worker.runtime.devserver import EmbeddedRedis
from worker.settings import WorkerSettings

log = logging.getLogger("bench.graph_page")

CHUNK = 500  #: notes per store_many() call
READY_MS = 600_000  #: how long the browser may take to lay a page out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1000, out


def seed(ctx: WorkerContext, mem: MemoryClient, ns: str, count: int) -> None:
    corpus = Corpus(11)
    texts = [corpus.note() for _ in range(count)]
    for start in range(0, count, CHUNK):
        mem.store_many(texts[start : start + CHUNK], namespace=ns)
    while sum(drain_shard(ctx, s).processed for s in range(ctx.keys.shard_count)):
        pass


def measure_once(
    mem: MemoryClient, st: Streams, ns: str, size: int, out: Path, chromium: str | None
) -> dict[str, float]:
    row: dict[str, float] = {}
    row["select_read_ms"], view = timed(
        lambda: read_view(st, ns, select(mem, st, ns, max_nodes=size))
    )
    assert isinstance(view, GraphView)
    row["nodes"], row["edges"] = len(view.nodes), len(view.edges)
    row["client_ms"], _ = timed(lambda: [mem.get(n["id"], namespace=ns) for n in view.nodes])
    row["html_ms"], html = timed(lambda: render_page(view))
    row["graphml_ms"], graphml = timed(lambda: to_graphml(view))
    row["cyjs_ms"], cyjs = timed(lambda: json.dumps(to_cytoscape(view), ensure_ascii=False))
    row["html_mb"] = len(html.encode()) / 1e6
    row["graphml_mb"] = len(graphml.encode()) / 1e6
    row["cyjs_mb"] = len(cyjs.encode()) / 1e6
    page = out / f"graph-{size}.html"
    page.write_text(html, encoding="utf-8")
    if chromium:
        row["browser_ms"], row["page_render_ms"] = browse(chromium, page)
    return row


def browse(chromium: str, page: Path) -> tuple[float, float]:
    """(wall ms of opening the page until its layout stopped, the page's own zqRenderMs)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        tab = browser.new_page(viewport={"width": 1280, "height": 800})
        start = time.perf_counter()
        tab.goto(page.as_uri(), timeout=READY_MS)
        tab.wait_for_selector("body[data-zq-ready='1']", timeout=READY_MS)
        wall = (time.perf_counter() - start) * 1000
        own = float(tab.evaluate("window.zqRenderMs"))
        browser.close()
    return wall, own


def run(args: argparse.Namespace) -> list[dict[str, float]]:
    chromium = shutil.which("chromium")
    if chromium is None:
        log.warning("no chromium on PATH (apt-get install chromium): browser columns skipped")
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis() as server:
        settings = WorkerSettings(
            redis_url=server.url, key_prefix="gbench", index_dir=Path(tmp) / "index"
        )
        ctx = WorkerContext.build(settings)
        with MemoryClient(settings) as mem:
            st = Streams(ctx.redis, ctx.keys)
            for size in args.sizes:
                ns = f"graph-{size}"
                start = time.perf_counter()
                seed(ctx, mem, ns, size)
                log.info(
                    "stored and organised %d notes in %.1fs", size, time.perf_counter() - start
                )
                runs = [
                    measure_once(mem, st, ns, size, Path(tmp), chromium) for _ in range(args.repeat)
                ]
                rows.append({k: statistics.median(r[k] for r in runs) for k in runs[0]})
        ctx.close()
    return rows


def table(rows: list[dict[str, float]]) -> str:
    head = (
        "| notes | links | direct client get() ms | select + read ms | html ms (MB) "
        "| graphml ms (MB) | cytoscape json ms (MB) | export / client | browser: open to laid "
        "out ms | page's own render ms |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        export = r["select_read_ms"] + r["html_ms"] + r["graphml_ms"] + r["cyjs_ms"]
        browser = f"{r['browser_ms']:,.0f}" if "browser_ms" in r else "-"
        own = f"{r['page_render_ms']:,.0f}" if "page_render_ms" in r else "-"
        lines.append(
            f"| {r['nodes']:,.0f} | {r['edges']:,.0f} | {r['client_ms']:,.0f} "
            f"| {r['select_read_ms']:,.0f} | {r['html_ms']:,.0f} ({r['html_mb']:.1f}) "
            f"| {r['graphml_ms']:,.0f} ({r['graphml_mb']:.1f}) "
            f"| {r['cyjs_ms']:,.0f} ({r['cyjs_mb']:.1f}) | {export / r['client_ms']:.2f} "
            f"| {browser} | {own} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,5000", help="notes per namespace, comma-separated")
    p.add_argument("--repeat", type=int, default=3, help="measurements per size (median)")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("worker").setLevel(logging.WARNING)
    load = os.getloadavg()[0]
    rows = run(args)
    print(table(rows))
    print(f"\n1-minute load average: {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
