"""The LangGraph store door: ZettelqStore and AsyncZettelqStore against real Redis and the real
worker code (the in-thread search server organises what a read waits for), through the real
langgraph-checkpoint BaseStore API. The behaviours are LangGraph's own store tests' (InMemory
and Postgres stores), written anew here."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TypedDict

import msgpack
import pytest

pytest.importorskip("langgraph.store.base", reason="needs the langgraph extra")

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from redis import Redis

from producer import AsyncMemoryClient, Backpressure, InvalidInput, MemoryClient
from producer.adapters.langgraph import AsyncZettelqStore, ZettelqStore
from producer.adapters.langgraph.mapping import (
    decode_namespace,
    encode_namespace,
    note_id,
)
from producer.keys import Keys
from tests.conftest import drain_all, make_settings
from worker import periodic
from worker.context import WorkerContext
from worker.server import SearchServer
from worker.settings import WorkerSettings


@pytest.fixture
def store(server: SearchServer, client: MemoryClient) -> Iterator[ZettelqStore]:
    s = ZettelqStore(client)
    yield s
    s.close()


def run_async(settings: WorkerSettings, scenario):  # type: ignore[no-untyped-def]
    """Run ``scenario(store)`` with an AsyncZettelqStore made inside the event loop."""

    async def main():  # type: ignore[no-untyped-def]
        async with AsyncMemoryClient(settings) as aclient:
            s = AsyncZettelqStore(aclient)
            try:
                return await scenario(s)
            finally:
                await s.aclose()

    return asyncio.run(main())


# --- the mapping ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace",
    [
        ("users", "alice"),
        ("a:b", "c/d", "e@f", "g-h_i"),
        ("with space", "ünïcödé", "中文", "{tag}", "%25", ":2E"),
        ("trailing\n",),
    ],
)
def test_namespace_encoding_is_a_valid_zettelq_namespace_and_reverses(namespace):
    name = encode_namespace(namespace)
    assert "{" not in name and "}" not in name
    assert len(name.split(".")) == len(namespace)
    assert decode_namespace(name) == namespace


def test_plain_labels_keep_their_names_so_the_direct_client_can_read_them():
    assert encode_namespace(("memories", "user-42")) == "memories.user-42"


def test_distinct_namespaces_and_keys_get_distinct_stable_ids():
    assert note_id("a.b", "k") == note_id("a.b", "k")
    assert len({note_id("a.b", "k"), note_id("a", "b.k"), note_id("a.b", "k2")}) == 3


def test_a_namespace_too_long_to_encode_is_refused_with_a_clear_error(store):
    with pytest.raises(InvalidInput, match="limit is 128"):
        store.put(("ü" * 30,), "k", {"a": 1})
    assert store.get(("ü" * 30,), "k") is None


@pytest.mark.parametrize("namespace", [(), ("langgraph", "x"), ("a.b",), ("",), ("a\x00",)])
def test_put_refuses_the_namespaces_langgraph_refuses(store, namespace):
    with pytest.raises(InvalidNamespaceError):
        store.put(namespace, "k", {"a": 1})


def test_batch_ops_are_checked_before_anything_is_written(store, client, settings):
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(("ok",), "k", {"a": 1}), PutOp(("bad.label",), "k", {"a": 1})])
    assert store.search(("ok",)) == []


def test_ttl_is_not_supported(store):
    assert store.supports_ttl is False
    with pytest.raises(NotImplementedError):
        store.put(("a",), "k", {"a": 1}, ttl=5)
    with pytest.raises(NotImplementedError):
        store.batch([PutOp(("a",), "k", {"a": 1}, ttl=5.0)])


# --- put / get / delete -----------------------------------------------------------------------


def test_get_reads_its_own_put_at_once_and_the_value_is_kept_exactly(store):
    value = {"text": "I like pizza", "n": 3, "f": 1.5, "ok": True, "none": None,
             "nested": {"list": [1, "two", {"three": 3}]}, "ünï": "中文"}  # fmt: skip
    store.put(("users", "alice"), "food", value)
    item = store.get(("users", "alice"), "food")
    assert isinstance(item, Item)
    assert item.value == value and list(item.value) == list(value)
    assert (item.namespace, item.key) == (("users", "alice"), "food")
    assert item.created_at.tzinfo is not None and item.created_at <= item.updated_at
    assert store.get(("users", "alice"), "missing") is None
    assert store.get(("users", "bob"), "food") is None


def test_put_of_an_existing_key_updates_the_same_note(store, client, settings):
    ns = ("users", "alice")
    store.put(ns, "k", {"v": 1})
    first = store.get(ns, "k")
    time.sleep(0.01)
    store.put(ns, "k", {"v": 2})
    second = store.get(ns, "k")
    assert second.value == {"v": 2}
    assert second.created_at == first.created_at
    assert second.updated_at > first.updated_at
    name = encode_namespace(ns)
    stats = client.stats(name)
    assert stats.notes == 1 and stats.tombstoned == 0
    note = client.get(note_id(name, "k"), namespace=name)
    assert note.version == 2


def test_delete_and_put_of_none_remove_the_item(store):
    ns = ("docs",)
    store.put(ns, "a", {"x": 1})
    store.put(ns, "b", {"x": 2})
    store.delete(ns, "a")
    store.put(ns, "b", None)  # type: ignore[arg-type]
    assert store.get(ns, "a") is None and store.get(ns, "b") is None
    assert store.search(ns) == []
    store.put(ns, "a", {"x": 3})
    assert store.get(ns, "a").value == {"x": 3}


def test_a_value_that_is_not_json_is_refused(store):
    with pytest.raises(InvalidInput, match="JSON"):
        store.put(("a",), "k", {"when": datetime.now(UTC)})
    with pytest.raises(InvalidInput, match="JSON"):
        store.put(("a",), "k", {"x": float("nan")})


def test_another_store_sees_the_writes_once_organised(store, settings, ctx):
    with MemoryClient(settings) as other_client:
        other = ZettelqStore(other_client)
        other.put(("shared",), "k", {"from": "other"})
        drain_all(ctx)
        assert store.get(("shared",), "k").value == {"from": "other"}
        other.close()


# --- batch ------------------------------------------------------------------------------------


def test_batch_results_come_in_op_order(store):
    store.put(("a",), "k1", {"v": 1})
    store.put(("a", "b"), "k2", {"v": 2})
    results = store.batch(
        [
            GetOp(("a",), "k1"),
            PutOp(("a",), "k3", {"v": 3}),
            ListNamespacesOp(),
            SearchOp(("a",)),
            GetOp(("a",), "nope"),
        ]
    )
    assert results[0].value == {"v": 1}
    assert results[1] is None
    assert results[2] == [("a",), ("a", "b")]
    assert {i.key for i in results[3]} == {"k1", "k2"}
    assert results[4] is None
    assert store.get(("a",), "k3").value == {"v": 3}


def test_last_write_wins_in_a_batch_and_reads_see_the_state_before_it(store):
    store.put(("a",), "k", {"v": 0})
    results = store.batch(
        [
            PutOp(("a",), "k", {"v": 1}),
            GetOp(("a",), "k"),
            PutOp(("a",), "k", {"v": 2}),
            PutOp(("a",), "gone", {"v": 1}),
            PutOp(("a",), "gone", None),
        ]
    )
    assert results[1].value == {"v": 0}
    assert store.get(("a",), "k").value == {"v": 2}
    assert store.get(("a",), "gone") is None


def test_n_puts_over_several_namespaces_are_one_pipeline(client, settings):
    store = ZettelqStore(client)  # no server: only the batch's own commands reach Redis
    monitor = Redis.from_url(settings.redis_url)
    namespaces = [("n", str(i)) for i in range(3)]
    store.batch([PutOp(namespaces[0], "warm", {"i": 0})])
    before = monitor.info("commandstats")
    store.batch([PutOp(namespaces[i % 3], f"k{i}", {"i": i}) for i in range(30)])
    after = monitor.info("commandstats")

    def calls(name):
        return after.get(f"cmdstat_{name}", {}).get("calls", 0) - before.get(
            f"cmdstat_{name}", {}
        ).get("calls", 0)

    keys = client.keys
    shards = {keys.shard_of(encode_namespace(ns)) for ns in namespaces}
    assert calls("evalsha") == len(shards)  # one per shard stream, no EVAL, no SCRIPT EXISTS
    assert calls("eval") == calls("script|exists") == calls("script") == 0
    assert calls("sadd") == 1  # the two namespaces not registered by the first batch
    inbox = sum(monitor.xlen(keys.inbox(shard)) for shard in shards)
    assert inbox == 31
    monitor.close()
    store.close()


def test_a_put_after_redis_lost_its_scripts_loads_the_script_again(store, settings):
    store.put(("s",), "before", {"v": 1})
    Redis.from_url(settings.redis_url).script_flush()
    store.put(("s",), "after", {"v": 2})
    assert store.get(("s",), "after").value == {"v": 2}


def test_the_puts_of_a_batch_are_jobs_on_the_inbox_before_any_worker_runs(client, settings):
    store = ZettelqStore(client)  # no server: nothing organises
    store.batch([PutOp(("q",), f"k{i}", {"i": i}) for i in range(5)])
    redis = Redis.from_url(settings.redis_url)
    keys = client.keys
    entries = redis.xrange(keys.inbox(keys.shard_of("q")))
    jobs = [msgpack.unpackb(fields[b"j"]) for _, fields in entries]
    assert [(j["op"], j["metadata"]["langgraph"]["key"]) for j in jobs] == [
        ("store", f"k{i}") for i in range(5)
    ]
    redis.close()
    store.close()


# --- search -----------------------------------------------------------------------------------


def seed(store):
    store.put(("docs", "a"), "1", {"text": "red apples grow on trees", "n": 1, "tag": "fruit"})
    store.put(("docs", "a"), "2", {"text": "bananas are yellow", "n": 2, "tag": "fruit"})
    store.put(("docs", "b"), "3", {"text": "carrots are orange roots", "n": 3, "tag": "veg"})
    store.put(("docsx",), "4", {"text": "apples in another tree of docs", "n": 4, "tag": "x"})


def test_search_covers_a_prefix_and_its_descendants_on_label_boundaries(store):
    seed(store)
    assert {i.key for i in store.search(("docs",))} == {"1", "2", "3"}
    assert {i.key for i in store.search(("docs", "a"))} == {"1", "2"}
    assert {i.key for i in store.search(("docsx",))} == {"4"}
    assert {i.key for i in store.search(("doc",))} == set()
    assert {i.key for i in store.search(())} == {"1", "2", "3", "4"}


def test_search_without_query_lists_newest_update_first_with_no_score(store):
    seed(store)
    store.put(("docs", "a"), "1", {"text": "red apples, updated", "n": 1, "tag": "fruit"})
    items = store.search(("docs",))
    assert [i.key for i in items] == ["1", "3", "2"]
    assert all(i.score is None for i in items)
    assert [i.updated_at for i in items] == sorted((i.updated_at for i in items), reverse=True)


def test_search_with_query_ranks_by_zettelq_score(store):
    seed(store)
    items = store.search(("docs",), query="apples trees", limit=3)
    assert items[0].key == "1" and isinstance(items[0].score, float)
    scores = [i.score for i in items if i.score is not None]
    assert scores == sorted(scores, reverse=True)
    assert {i.key for i in items} == {"1", "2", "3"}  # the rest fill the page
    flags = [i.score is None for i in items]
    assert flags == sorted(flags)  # scored first, then unscored (score None)
    assert "4" not in {i.key for i in store.search(("docs",), query="apples", limit=10)}


FILTER_CASES = [
    ({"tag": "fruit"}, {"1", "2"}),
    ({"tag": {"$eq": "veg"}}, {"3"}),
    ({"tag": {"$ne": "fruit"}}, {"3", "4"}),
    ({"n": {"$gt": 2}}, {"3", "4"}),
    ({"n": {"$gte": 2}}, {"2", "3", "4"}),
    ({"n": {"$lt": 2}}, {"1"}),
    ({"n": {"$lte": 2, "$gt": 1}}, {"2"}),
    ({"tag": "fruit", "n": 2}, {"2"}),
    ({"missing": {"$gt": 1}}, set()),
    ({"text": {"$gt": 1}}, set()),
]


def test_filters_eq_ne_gt_gte_lt_lte_and_and(store):
    seed(store)
    for wanted, keys in FILTER_CASES:
        assert {i.key for i in store.search((), filter=wanted)} == keys, wanted


def test_filters_on_nested_keys_and_lists(store):
    store.put(("f",), "a", {"meta": {"owner": {"name": "ann"}, "size": 5}, "tags": ["x", "y"]})
    store.put(("f",), "b", {"meta": {"owner": {"name": "bob"}, "size": 9}, "tags": ["x"]})
    assert [i.key for i in store.search(("f",), filter={"meta": {"owner": {"name": "ann"}}})] == [
        "a"
    ]
    assert [i.key for i in store.search(("f",), filter={"meta": {"size": {"$gt": 6}}})] == ["b"]
    assert [i.key for i in store.search(("f",), filter={"tags": ["x"]})] == ["b"]
    assert store.search(("f",), filter={"meta": "flat"}) == []


def test_filter_applies_with_a_query_too(store):
    seed(store)
    items = store.search(("docs",), query="apples bananas", filter={"n": {"$gte": 2}})
    assert {i.key for i in items} == {"2", "3"}
    assert items[0].key == "2" and items[0].score is not None


def test_an_unknown_filter_operator_is_a_clear_error(store):
    with pytest.raises(InvalidInput, match=r"\$regex"):
        store.search(("a",), filter={"x": {"$regex": "a.*"}})


def test_offset_and_limit_page_through_results(store):
    for i in range(7):
        store.put(("p",), f"k{i}", {"i": i})
    pages = [store.search(("p",), limit=3, offset=o) for o in (0, 3, 6)]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i.key for p in pages for i in p] == [f"k{i}" for i in reversed(range(7))]
    scored = store.search(("p",), query="i", limit=2, offset=5)
    assert len(scored) == 2


def test_index_false_and_index_paths_choose_what_text_is_searchable(store, client):
    ns = ("idx",)
    store.put(ns, "whole", {"title": "zebra", "body": "walrus"})
    store.put(ns, "title", {"title": "walrus", "body": "zebra"}, index=["title"])
    store.put(ns, "hidden", {"title": "zebra walrus"}, index=False)
    store.put(ns, "list", {"items": [{"t": "zebra"}, {"t": "okapi"}]}, index=["items[*].t"])
    zebra = store.search(ns, query="zebra", limit=10)
    assert {i.key for i in zebra[:2]} == {"whole", "list"}
    walrus = store.search(ns, query="walrus", limit=10)
    assert {i.key for i in walrus[:2]} == {"whole", "title"}
    assert all(i.score is None for i in zebra + walrus if i.key == "hidden")
    okapi = [i for i in store.search(ns, query="okapi", limit=1)]
    assert okapi[0].key == "list" and okapi[0].score is not None
    assert store.get(ns, "hidden").value == {"title": "zebra walrus"}
    name = encode_namespace(ns)
    assert client.get(note_id(name, "title"), namespace=name).content == "walrus"


def test_non_ascii_values_and_queries(store):
    store.put(("u",), "1", {"text": "这是中文"})
    store.put(("u",), "2", {"text": "これは日本語です"})
    store.put(("u",), "3", {"text": "Привет мир"})
    assert store.get(("u",), "1").value == {"text": "这是中文"}
    items = store.search(("u",), query="Привет мир")
    assert items[0].key == "3" and items[0].score is not None


def test_search_over_more_namespaces_than_one_zettelq_search_covers(store):
    for i in range(20):
        store.put(("many", f"n{i:02d}"), "k", {"text": f"needle {i}" if i == 17 else "hay"})
    items = store.search(("many",), query="needle", limit=3)
    assert items[0].namespace == ("many", "n17") and items[0].score is not None
    assert len(store.search(("many",), limit=50)) == 20


def test_direct_notes_in_the_namespace_are_not_items_even_with_item_metadata(store, client, ctx):
    store.put(("mixed",), "k", {"text": "kept item about tea"})
    client.store("a plain note about tea", namespace="mixed")
    forged = {"key": "forged", "value": {"text": "tea"}, "indexed": True, "at": 1.0}
    client.store("a note posing as an item, tea", namespace="mixed", metadata={"langgraph": forged})
    drain_all(ctx)
    assert [i.key for i in store.search(("mixed",), query="tea")] == ["k"]
    assert [i.key for i in store.search(("mixed",))] == ["k"]


# --- list_namespaces --------------------------------------------------------------------------


def seed_namespaces(store):
    for ns in [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
        ("users", "123"),
        ("users", "456", "settings"),
        ("admin", "users", "789"),
    ]:
        store.put(ns, "k", {"v": 1})


def test_list_namespaces_prefix_suffix_and_wildcards(store):
    seed_namespaces(store)
    assert store.list_namespaces(prefix=("a", "b")) == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    assert store.list_namespaces(suffix=("f",)) == [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert store.list_namespaces(prefix=("a",), suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(suffix=("*", "f")) == [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert store.list_namespaces(prefix=("users",)) == [
        ("users", "123"),
        ("users", "456", "settings"),
    ]
    assert store.list_namespaces(prefix=("nope",)) == []
    assert store.list_namespaces(prefix=("a", "b", "c", "d", "e")) == []


def test_list_namespaces_max_depth_pagination_and_no_conditions(store):
    seed_namespaces(store)
    assert store.list_namespaces(prefix=("a", "b"), max_depth=3) == [
        ("a", "b", "c"),
        ("a", "b", "d"),
        ("a", "b", "f"),
    ]
    everything = store.list_namespaces()
    assert len(everything) == 9 and everything == sorted(everything)
    assert store.list_namespaces(max_depth=1) == [("a",), ("admin",), ("b",), ("users",)]
    assert store.list_namespaces(limit=3) == everything[:3]
    assert store.list_namespaces(limit=3, offset=7) == everything[7:]
    assert store.list_namespaces(offset=20) == []


def test_list_namespaces_segment_boundary_and_emptied_namespaces(store):
    store.put(("foo",), "k", {"v": 1})
    store.put(("foobar",), "k", {"v": 1})
    store.put(("gone",), "k", {"v": 1})
    assert store.list_namespaces(prefix=("foo",)) == [("foo",)]
    store.delete(("gone",), "k")
    assert store.list_namespaces() == [("foo",), ("foobar",)]


def test_list_namespaces_of_an_empty_store(store):
    assert store.list_namespaces() == []


# --- the async twin ---------------------------------------------------------------------------


def test_async_store_put_get_search_list_and_delete(settings, server):
    async def scenario(s):
        await s.aput(("a", "b"), "k", {"text": "async apples"})
        await s.aput(("a", "c"), "j", {"text": "async pears", "n": 2})
        got = await s.aget(("a", "b"), "k")
        found = await s.asearch(("a",), query="apples")
        listed = await s.alist_namespaces(prefix=("a",))
        filtered = await s.asearch(("a",), filter={"n": {"$gte": 2}})
        await s.aput(("a", "b"), "k", {"text": "updated"})
        updated = await s.aget(("a", "b"), "k")
        await s.adelete(("a", "b"), "k")
        return got, found, listed, filtered, updated, await s.aget(("a", "b"), "k")

    got, found, listed, filtered, updated, deleted = run_async(settings, scenario)
    assert got.value == {"text": "async apples"}
    assert found[0].key == "k" and found[0].score is not None
    assert listed == [("a", "b"), ("a", "c")]
    assert [i.key for i in filtered] == ["j"]
    assert updated.value == {"text": "updated"} and updated.created_at == got.created_at
    assert deleted is None


def test_async_concurrent_puts_share_one_batch_and_last_write_wins(settings, server):
    async def scenario(s):
        await asyncio.gather(*(s.aput(("c",), f"k{i}", {"i": i}) for i in range(20)))
        await asyncio.gather(s.aput(("c",), "same", {"v": 1}), s.aput(("c",), "same", {"v": 2}))
        return await s.asearch(("c",), limit=50), await s.aget(("c",), "same")

    items, same = run_async(settings, scenario)
    assert len(items) == 21
    assert same.value == {"v": 2}


def test_async_store_abatch_keeps_op_order(settings, server):
    async def scenario(s):
        await s.aput(("o",), "k", {"v": 0})
        return await s.abatch(
            [PutOp(("o",), "k", {"v": 1}), GetOp(("o",), "k"), ListNamespacesOp(), SearchOp(("o",))]
        )

    results = run_async(settings, scenario)
    assert results[0] is None and results[1].value == {"v": 0}
    assert results[2] == [("o",)] and [i.value for i in results[3]] == [{"v": 0}]


def test_async_store_sync_calls_from_another_thread_run_on_its_loop(settings, server):
    async def scenario(s):
        await asyncio.to_thread(s.put, ("t",), "k", {"v": "from a thread"})
        return await asyncio.to_thread(s.get, ("t",), "k")

    assert run_async(settings, scenario).value == {"v": "from a thread"}


def test_sync_store_abatch_works_in_an_event_loop(store):
    async def scenario():
        await store.aput(("s",), "k", {"v": 1})
        return await store.aget(("s",), "k"), await store.alist_namespaces()

    item, names = asyncio.run(scenario())
    assert item.value == {"v": 1} and names == [("s",)]


def test_match_condition_ops_given_to_batch_directly(store):
    seed_namespaces(store)
    op = ListNamespacesOp(
        match_conditions=(MatchCondition("prefix", ("a", "*")), MatchCondition("suffix", ("f",)))
    )
    assert store.batch([op])[0] == [("a", "b", "f"), ("a", "c", "f")]


# --- a compiled graph ---------------------------------------------------------------------


class Turn(TypedDict):
    user: str
    fact: str
    recalled: str
    found: list[str]


def remember(state: Turn, runtime: Runtime) -> dict[str, object]:
    assert runtime.store is not None
    runtime.store.put(("memories", state["user"]), "fact-1", {"content": state["fact"]})
    return {}


def recall(state: Turn, runtime: Runtime) -> dict[str, object]:
    assert runtime.store is not None
    ns = ("memories", state["user"])
    item = runtime.store.get(ns, "fact-1")
    hits = runtime.store.search(("memories",), query="tea")
    return {"recalled": item.value["content"] if item else "", "found": [h.key for h in hits]}


async def arecall(state: Turn, runtime: Runtime) -> dict[str, object]:
    assert runtime.store is not None
    item = await runtime.store.aget(("memories", state["user"]), "fact-1")
    return {"recalled": item.value["content"] if item else "", "found": []}


def build_graph(second: object) -> StateGraph:
    graph = StateGraph(Turn)
    graph.add_node("remember", remember)
    graph.add_node("recall", second)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    return graph


def test_a_state_graph_reads_its_own_write_in_the_next_node(store):
    app = build_graph(recall).compile(store=store)
    out = app.invoke({"user": "ann", "fact": "Ann drinks green tea", "recalled": "", "found": []})
    assert out["recalled"] == "Ann drinks green tea"
    assert out["found"] == ["fact-1"]


def test_an_async_state_graph_on_the_async_store(settings, server):
    async def scenario(s):
        app = build_graph(arecall).compile(store=s)
        return await app.ainvoke(
            {"user": "bo", "fact": "Bo likes chess", "recalled": "", "found": []}
        )

    assert run_async(settings, scenario)["recalled"] == "Bo likes chess"


def test_langmem_manage_then_search_round_trip(store):
    langmem = pytest.importorskip("langmem", reason="langmem is optional (not in the dev extra)")
    ns = ("memories", "team")
    manage = langmem.create_manage_memory_tool(ns, store=store)
    search = langmem.create_search_memory_tool(ns, store=store)
    created = manage.invoke({"content": "Ann prefers green tea", "action": "create"})
    memory_id = created.rsplit(" ", 1)[1]
    manage.invoke({"content": "Ann prefers oolong tea", "action": "update", "id": memory_id})
    manage.invoke({"content": "Bo plays chess", "action": "create"})
    found = json.loads(search.invoke({"query": "tea", "limit": 5}))
    assert found[0]["key"] == memory_id and found[0]["namespace"] == list(ns)
    assert found[0]["value"] == {"content": "Ann prefers oolong tea"}
    assert found[0]["score"] is not None
    assert len(found) == 2


def test_organisation_keeps_every_item_merge_supersession_and_insights_included(store, ctx):
    ns = ("org",)
    same = {"content": "Postgres stores the solar panel readings every minute."}
    for key in ("dup-1", "dup-2", "dup-3"):
        store.put(ns, key, same)
    texts = [
        "Solar panel readings arrive from the inverters over MQTT.",
        "The inverters push solar panel readings to Postgres through MQTT.",
        "The solar panel readings store moved from Postgres to TimescaleDB.",
    ]
    for i, text in enumerate(texts):
        store.put(ns, f"t{i}", {"content": text})
    assert len(store.search(ns, limit=20)) == 6
    runs = periodic.organise(ctx, encode_namespace(ns), None, time.time() + 30)
    assert {r.job for r in runs} >= {"merge", "supersede", "consolidate"}
    for key in ("dup-1", "dup-2", "dup-3"):
        assert store.get(ns, key).value == same
    assert sorted(i.key for i in store.search(ns, limit=20)) == [
        "dup-1", "dup-2", "dup-3", "t0", "t1", "t2"
    ]  # fmt: skip
    assert {i.key for i in store.search(ns, query="solar panel readings", limit=20)} == {
        "dup-1", "dup-2", "dup-3", "t0", "t1", "t2"
    }  # fmt: skip


BLOCKED_IMPORT = """
import sys
import threading

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("langgraph", "langchain_core"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Block())
import producer
assert not [m for m in sys.modules if m.startswith(("langgraph", "producer.adapters"))]
try:
    import producer.adapters.langgraph
except ImportError as exc:
    print(exc)
"""


def test_producer_stays_light_and_a_missing_extra_names_it():
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT], capture_output=True, text=True, check=True
    )
    assert "pip install 'zettelq[langgraph]'" in out.stdout


def test_labels_with_like_metacharacters_newlines_and_escapes_are_literal(store):
    for label in ("a%b", "a_b", "axb", "a:25b", "line\n", "line"):
        store.put((label, "x"), "k", {"label": label})
    for label in ("a%b", "a_b", "axb", "a:25b", "line\n", "line"):
        assert [i.value["label"] for i in store.search((label,))] == [label]
        assert store.get((label, "x"), "k").value == {"label": label}
    assert ("line\n", "x") in store.list_namespaces(prefix=("line\n",))


def test_search_edge_cases(store):
    store.put(("e",), "k", {"text": "edge"})
    assert [i.score for i in store.search(("e",), query="")] == [None]
    assert store.search(("e",), query="edge", offset=5) == []
    assert store.search(("nothing",), query="edge") == []
    assert store.search(("e",), query="no word in any note at all")[0].key == "k"


def test_read_your_writes_holds_for_each_of_several_threads_sharing_a_store(store):
    failures: list[str] = []

    def agent(n: int) -> None:
        for i in range(8):
            key = f"t{n}-{i}"
            store.put(("threads",), key, {"n": n, "i": i})
            item = store.get(("threads",), key)
            if item is None or item.value != {"n": n, "i": i}:
                failures.append(key)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(store.search(("threads",), limit=100)) == 32


def test_an_update_changes_what_the_item_is_found_by(store):
    store.put(("v",), "a", {"text": "zebra stripes"})
    store.put(("v",), "b", {"text": "zebra"})
    store.put(("v",), "b", {"text": "walrus tusks"})
    assert store.search(("v",), query="walrus", limit=1)[0].key == "b"
    assert store.search(("v",), query="zebra", limit=1)[0].key == "a"


def test_a_search_flushes_only_the_written_namespaces_it_covers(store, client, settings):
    store.put(("one",), "k", {"v": 1})
    store.put(("two",), "k", {"v": 2})
    assert [i.value for i in store.search(("one",))] == [{"v": 1}]
    assert store._tracker.dirty() == [encode_namespace(("two",))]
    assert store.list_namespaces() == [("one",), ("two",)]
    assert store._tracker.dirty() == []


def test_async_puts_of_one_tick_are_one_batch_with_the_last_write_winning(settings):
    monitor = Redis.from_url(settings.redis_url)

    async def scenario(s):
        await s.aput(("tick",), "warm", {"v": 0})
        before = monitor.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        await asyncio.gather(*(s.aput(("tick",), f"k{i % 5}", {"i": i}) for i in range(20)))
        return monitor.info("commandstats")["cmdstat_evalsha"]["calls"] - before

    assert run_async(settings, scenario) == 1  # no worker runs: only the store's commands
    keys = Keys(settings.key_prefix, settings.shard_count)
    entries = monitor.xrange(keys.inbox(keys.shard_of("tick")))
    jobs = [msgpack.unpackb(fields[b"j"]) for _, fields in entries]
    last = {j["metadata"]["langgraph"]["key"]: j["metadata"]["langgraph"]["value"] for j in jobs}
    assert len(jobs) == 6  # the warm-up put, then one job per key
    assert last == {"warm": {"v": 0}, **{f"k{i}": {"i": 15 + i} for i in range(5)}}
    monitor.close()


def test_a_batch_over_a_full_shard_raises_and_the_other_shards_writes_are_still_read(
    tmp_path, redis_db
):
    settings = make_settings(tmp_path, max_pending=2)
    keys = Keys(settings.key_prefix, settings.shard_count)
    full, other = (
        ("full",),
        next((f"o{i}",) for i in range(100) if keys.shard_of(f"o{i}") != keys.shard_of("full")),
    )
    ctx = WorkerContext.build(settings)
    server = SearchServer(ctx).start()
    try:
        with MemoryClient(settings) as client:
            store = ZettelqStore(client)
            store.batch([PutOp(full, "a", {"v": 1}), PutOp(full, "b", {"v": 2})])
            with pytest.raises(Backpressure):
                store.batch([PutOp(full, "c", {"v": 3}), PutOp(other, "k", {"v": 4})])
            assert store.get(other, "k").value == {"v": 4}
            assert store.get(full, "c") is None and store.get(full, "b").value == {"v": 2}
            store.close()
    finally:
        server.stop()
        ctx.close()
