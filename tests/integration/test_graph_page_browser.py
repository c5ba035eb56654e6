"""The graph page in a real headless Chromium (Debian's chromium, driven by Playwright): it draws
every node, the search box highlights the matching notes, a note holding a script tag shows as
text and runs nothing, the page loads nothing from the network, and an empty namespace draws an
empty graph. Set ZQ_TEST_SCREENSHOT to a path to keep a screenshot of the page
(docs/graph-explorer.png is one)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer import MemoryClient
from tests.conftest import make_settings
from tests.integration.graph_story import NS, SVELTE, XSS, store_story
from worker.connection import Streams
from worker.context import WorkerContext
from worker.explorer.page import render_page
from worker.explorer.view import read_view, select
from worker.runtime.servers import SearchServer

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs playwright: pip install 'zettelq[dev]'"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Chromium: apt-get install chromium (Debian's package)"
)
READY_MS = 30_000  #: how long the page may take to lay the graph out
#: click a node as a person would (returns nothing: a Cytoscape collection is slow to serialise)
TAP = "id => { zqGraph.getElementById(id).emit('tap'); }"


@pytest.fixture
def page_file(redis_db, tmp_path) -> Iterator[tuple[Path, dict[str, str], int, int]]:
    """The story's page on disk, its ids by content, and its node and edge counts."""
    ctx = WorkerContext.build(make_settings(tmp_path, consolidate_min_weight=0.2))
    srv = SearchServer(ctx).start()
    try:
        with MemoryClient(ctx.settings) as mem:
            story = store_story(ctx, mem)
            st = Streams(ctx.redis, ctx.keys)
            view = read_view(st, NS, select(mem, st, NS))
            empty = read_view(st, "nothing", select(mem, st, "nothing"))
    finally:
        srv.stop()
        ctx.close()
    path = tmp_path / "graph.html"
    path.write_text(render_page(view), encoding="utf-8")
    (tmp_path / "empty.html").write_text(render_page(empty), encoding="utf-8")
    yield path, story.ids, len(view.nodes), len(view.edges)


@pytest.fixture
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


def test_the_page_draws_every_note_highlights_matches_and_keeps_hostile_text_as_text(
    page_file, browser
):
    path, ids, nodes, edges = page_file
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-zq-ready='1']", timeout=READY_MS)

    assert page.evaluate("zqGraph.nodes().length") == nodes
    assert page.evaluate("zqGraph.edges().length") == edges

    page.fill("#zq-search", "svelte")
    matched = page.evaluate("zqGraph.nodes('.zq-match').map(n => n.id())")
    assert ids[SVELTE] in matched and ids[XSS] not in matched
    assert page.text_content("#zq-count") == f"{len(matched)} matching"

    page.evaluate(TAP, ids[XSS])
    assert page.text_content("#zq-pane .zq-content") == XSS
    assert page.evaluate("document.querySelectorAll('script').length") == 6
    assert page.evaluate("document.querySelectorAll('#zq-pane *').length") > 0
    assert page.evaluate("document.querySelectorAll('#zq-pane script').length") == 0

    page.fill("#zq-search", "")
    page.evaluate(TAP, ids[SVELTE])
    page.evaluate("zqGraph.fit(null, 30) && null")
    shot = page.screenshot()
    assert dialogs == [] and errors == []
    assert requests == [path.as_uri()]  # the page itself, nothing else
    page.goto((path.parent / "empty.html").as_uri())  # an empty namespace draws an empty graph
    page.wait_for_selector("body[data-zq-ready='1']", timeout=READY_MS)
    assert page.text_content("#zq-summary").startswith("0 of 0 notes, 0 links")
    keep = os.environ.get("ZQ_TEST_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(shot)
