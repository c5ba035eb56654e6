"""The graph explorer against real Redis and the real worker code: which notes each selection
shows (most connected, seed and hops, search hits), what nodes and edges carry (styles, audit
history, link metadata), that hostile text stays text in the page, that GraphML and Cytoscape
JSON read back in networkx with the same counts, and the ``zettelq graph`` command."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer import MemoryClient, NotFound
from producer.protocol import Note
from tests.conftest import drain_all, make_settings
from tests.integration.graph_story import CONTROL, NS, REACT, SVELTE, XSS, Story, store_story
from worker.cli import main as cli
from worker.connection import Streams
from worker.context import WorkerContext
from worker.explorer.export import to_cytoscape, to_graphml
from worker.explorer.page import VENDOR_SCRIPTS, render_page
from worker.explorer.view import GraphView, read_view, select, styles_of
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings


@pytest.fixture
def gctx(redis_db, tmp_path) -> Iterator[WorkerContext]:
    ctx = WorkerContext.build(make_settings(tmp_path, consolidate_min_weight=0.2))
    yield ctx
    ctx.close()


@pytest.fixture
def mem(gctx: WorkerContext) -> Iterator[MemoryClient]:
    srv = SearchServer(gctx).start()
    try:
        with MemoryClient(gctx.settings) as client:
            yield client
    finally:
        srv.stop()


@pytest.fixture
def story(gctx: WorkerContext, mem: MemoryClient) -> Story:
    return store_story(gctx, mem)


@pytest.fixture
def st(gctx: WorkerContext) -> Streams:
    return Streams(gctx.redis, gctx.keys)


def view_of(mem: MemoryClient, st: Streams, **how) -> GraphView:
    return read_view(st, NS, select(mem, st, NS, **how))


def neighbours(ctx: WorkerContext, nid: str) -> set[str]:
    return {nb.decode() for nb in ctx.redis.hkeys(ctx.keys.links(NS, nid))}


def linked_pairs(ctx: WorkerContext, ids: set[str]) -> set[frozenset[str]]:
    return {frozenset((a, b)) for a in ids for b in neighbours(ctx, a) if b in ids and a != b}


def test_the_default_shows_the_most_connected_notes_and_every_link_between_them(
    gctx, mem, st, story
):
    everything = view_of(mem, st, max_nodes=1000)
    active = {m.decode() for m in gctx.redis.zrange(gctx.keys.active(NS), 0, -1)}
    assert {n["id"] for n in everything.nodes} == active
    assert everything.selection["truncated"] is False

    view = view_of(mem, st, max_nodes=4)
    shown = {n["id"] for n in view.nodes}
    degree = {nid: len(neighbours(gctx, nid)) for nid in active}
    assert len(shown) == 4 and view.selection["truncated"] is True
    assert min(degree[n] for n in shown) >= max(degree[n] for n in active - shown)
    edges = {frozenset((e["source"], e["target"])) for e in view.edges}
    assert edges == linked_pairs(gctx, shown) and len(edges) == len(view.edges)


def test_a_seed_shows_the_notes_within_its_hops(gctx, mem, st, story):
    svelte = story.ids[SVELTE]
    assert [n["id"] for n in view_of(mem, st, seed=svelte, hops=0).nodes] == [svelte]

    one = {n["id"] for n in view_of(mem, st, seed=svelte, hops=1).nodes}
    assert one == {svelte} | neighbours(gctx, svelte)
    two = {n["id"] for n in view_of(mem, st, seed=svelte, hops=2).nodes}
    assert two == one.union(*(neighbours(gctx, n) for n in one))

    capped = view_of(mem, st, seed=svelte, hops=2, max_nodes=2)
    assert capped.nodes[0]["id"] == svelte and len(capped.nodes) == 2


def test_a_view_never_shows_another_namespace(gctx, mem, st, story):
    (other,) = mem.store_many([SVELTE], namespace="elsewhere")
    drain_all(gctx)
    assert other not in {n["id"] for n in view_of(mem, st).nodes}
    view = read_view(st, "elsewhere", select(mem, st, "elsewhere"))
    assert [n["id"] for n in view.nodes] == [other] and view.edges == []
    with pytest.raises(NotFound):
        select(mem, st, "elsewhere", seed=story.ids[SVELTE])


def test_an_unknown_seed_is_not_found(mem, st, story):
    with pytest.raises(NotFound):
        select(mem, st, NS, seed="no-such-note", hops=1)


def test_a_query_shows_the_search_hits_then_their_neighbours(gctx, mem, st, story):
    hits = [h.id for h in mem.search("solar panel readings", namespace=NS, k=5)]
    view = view_of(mem, st, query="solar panel readings", max_nodes=5)
    assert [n["id"] for n in view.nodes] == hits
    assert view.selection["mode"] == "query" and view.selection["query"] == "solar panel readings"

    wider = {n["id"] for n in view_of(mem, st, query="Svelte", hops=1).nodes}
    first = mem.search("Svelte", namespace=NS, k=1)[0].id
    assert {first} | neighbours(gctx, first) <= wider


def test_nodes_carry_styles_fields_and_audit_history_and_edges_their_link(gctx, mem, st, story):
    view = view_of(mem, st)
    nodes = {n["id"]: n for n in view.nodes}
    react, svelte = nodes[story.ids[REACT]], nodes[story.ids[SVELTE]]
    assert react["styles"] == ["note", "superseded"] and react["superseded_by"] == svelte["id"]
    assert nodes[story.insight]["styles"] == ["insight"]
    assert svelte["styles"] == ["note"] and svelte["agent"] == "tester"
    assert "story" in svelte["tags"] and svelte["created_at"].endswith("Z")
    assert svelte["event_time"] == "2026-01-06T00:00:00Z"
    assert [a["op"] for a in react["audit"]] == ["supersede", "create"]  # newest first
    assert {"superseded_by", "valid_to"} <= set(react["audit"][0]["fields"])
    assert react["audit"][1]["actor"] == "tester" and react["audit"][1]["source"].startswith(
        "inbox:"
    )
    (edge,) = [e for e in view.edges if {e["source"], e["target"]} == {react["id"], svelte["id"]}]
    assert edge["style"] == "supersession" and 0 < edge["weight"] <= 1
    assert edge["reason"] in ("supersedes", "superseded_by") and edge["at"].endswith("Z")
    abstracted = [e for e in view.edges if story.insight in (e["source"], e["target"])]
    assert abstracted and all(e["style"] == "abstraction" for e in abstracted)
    assert all(e["provenance"] == "consolidation" for e in abstracted)


def test_atom_and_source_notes_have_styles_of_their_own():
    atom = Note(id="a", namespace=NS, content="x", metadata={"part_of": "s"})
    source = Note(id="s", namespace=NS, content="x", kind="source")
    odd = Note(id="o", namespace=NS, content="x", kind="something-new", valid_to=1.0)
    assert styles_of(atom) == ["note", "atom"] and styles_of(source) == ["source"]
    assert styles_of(odd) == ["note", "superseded"]


def embedded_data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="zq-data">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1))


def test_hostile_text_stays_text_in_the_page_and_nothing_is_fetched(mem, st, story):
    view = view_of(mem, st)
    page = render_page(view)
    assert XSS not in page and "alert(1)" in page  # present, but only escaped
    assert page.count("<script") == 1 + len(VENDOR_SCRIPTS) + 1
    data = embedded_data(page)
    contents = {n["id"]: n["content"] for n in data["nodes"]}
    assert contents[story.ids[XSS]] == XSS and contents[story.ids[CONTROL]] == CONTROL
    assert len(data["nodes"]) == len(view.nodes) and len(data["edges"]) == len(view.edges)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<link" not in page and "default-src 'none'" in page


def test_a_namespace_in_script_breaking_metadata_is_escaped_too(mem, st, story):
    view = view_of(mem, st, max_nodes=1)
    view.nodes[0]["metadata"] = {"</script><script>alert(2)</script>": "&amp; \u2028"}
    page = render_page(view)
    assert "alert(2)</script>" not in page and "\u2028" not in page
    assert embedded_data(page)["nodes"][0]["metadata"] == view.nodes[0]["metadata"]


def test_graphml_and_cytoscape_json_read_back_in_networkx_with_the_same_counts(
    mem, st, story, tmp_path
):
    nx = pytest.importorskip("networkx", reason="networkx reads the exports back (dev extra)")
    view = view_of(mem, st)
    path = tmp_path / "g.graphml"
    path.write_text(to_graphml(view), encoding="utf-8")
    g = nx.read_graphml(path)
    assert (g.number_of_nodes(), g.number_of_edges()) == (len(view.nodes), len(view.edges))
    assert g.nodes[story.ids[XSS]]["content"] == XSS
    assert g.nodes[story.ids[CONTROL]]["content"] == CONTROL.replace("\x07", "\ufffd").replace(
        "\x1b", "\ufffd"
    )
    assert json.loads(g.nodes[story.ids[SVELTE]]["tags"]) == view_node(view, SVELTE, story)["tags"]
    assert g.nodes[story.insight]["styles"] == "insight"
    assert all(0 < w <= 1 for _, _, w in g.edges(data="weight"))

    c = nx.cytoscape_graph(json.loads(json.dumps(to_cytoscape(view))))
    assert (c.number_of_nodes(), c.number_of_edges()) == (len(view.nodes), len(view.edges))
    assert c.nodes[story.ids[CONTROL]]["content"] == CONTROL
    assert c.graph["namespace"] == NS


def view_node(view: GraphView, content: str, story: Story) -> dict:
    return next(n for n in view.nodes if n["id"] == story.ids[content])


def cli_settings(settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("redis_url", "key_prefix", "shard_count", "index_dir"):
        monkeypatch.setenv(f"ZQ_{name.upper()}", str(getattr(settings, name)))


def test_the_command_writes_every_format_and_says_what_it_wrote(
    gctx, story, tmp_path: Path, monkeypatch, capsys
):
    cli_settings(gctx.settings, monkeypatch)
    html, graphml, cyjs = tmp_path / "g.html", tmp_path / "g.graphml", tmp_path / "g.json"
    argv = ["graph", NS, "--html", str(html), "--graphml", str(graphml)]
    argv += ["--cytoscape-json", str(cyjs), "--seed", story.ids[SVELTE], "--hops", "1", "--json"]
    assert cli.main(argv) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["nodes"] == len(neighbours(gctx, story.ids[SVELTE])) + 1
    assert said["mode"] == "seed" and said["files"] == [str(html), str(graphml), str(cyjs)]
    assert len(embedded_data(html.read_text())["nodes"]) == said["nodes"]
    assert len(json.loads(cyjs.read_text())["elements"]["edges"]) == said["edges"]
    assert graphml.read_text().startswith("<?xml") and list(tmp_path.glob(".g.*")) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "needs at least one of --html"),
        (["--html", "x.html", "--hops", "1"], "--hops needs --seed or --query"),
        (["--html", "x.html", "--max-nodes", "0"], "--max-nodes"),
        (["--html", "x.html", "--seed", "s", "--hops", "9"], "--hops"),
    ],
)
def test_bad_options_are_one_usage_error_and_write_nothing(
    settings, monkeypatch, capsys, tmp_path, args, message
):
    cli_settings(settings, monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["graph", NS, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zettelq: error: ") and message in err
    assert list(tmp_path.iterdir()) == []


def test_a_bad_namespace_is_a_usage_error(settings, monkeypatch, capsys, tmp_path):
    cli_settings(settings, monkeypatch)
    assert cli.main(["graph", "bad{ns}", "--html", str(tmp_path / "x.html")]) == 2
    assert "namespace must be" in capsys.readouterr().err
