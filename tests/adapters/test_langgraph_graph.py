"""AsyncZettelqStore, compiled StateGraphs on both stores (a node reads the previous node's
write) and LangMem's memory tools, against real Redis and the real worker code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import TypedDict

import msgpack
import pytest

pytest.importorskip("langgraph.store.base", reason="needs the langgraph extra")

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    GetOp,
    ListNamespacesOp,
    PutOp,
    SearchOp,
)
from redis import Redis

from producer import AsyncMemoryClient, MemoryClient
from producer.adapters.langgraph import AsyncZettelqStore, ZettelqStore
from producer.keys import Keys
from worker.runtime.servers import SearchServer
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


def check_langmem_found(found: list[dict[str, object]], memory_id: str) -> None:
    assert found[0]["key"] == memory_id and found[0]["namespace"] == ["memories", "team"]
    assert found[0]["value"] == {"content": "Ann prefers oolong tea"}
    assert found[0]["score"] is not None
    assert len(found) == 2


def test_langmem_manage_then_search_round_trip(store):
    langmem = pytest.importorskip("langmem", reason="pip install langmem")
    manage = langmem.create_manage_memory_tool(("memories", "team"), store=store)
    search = langmem.create_search_memory_tool(("memories", "team"), store=store)
    created = manage.invoke({"content": "Ann prefers green tea", "action": "create"})
    memory_id = created.rsplit(" ", 1)[1]
    manage.invoke({"content": "Ann prefers oolong tea", "action": "update", "id": memory_id})
    manage.invoke({"content": "Bo plays chess", "action": "create"})
    check_langmem_found(json.loads(search.invoke({"query": "tea", "limit": 5})), memory_id)


def test_langmem_async_tools_on_the_async_store(settings, server):
    langmem = pytest.importorskip("langmem", reason="pip install langmem")

    async def scenario(s):
        manage = langmem.create_manage_memory_tool(("memories", "team"), store=s)
        search = langmem.create_search_memory_tool(("memories", "team"), store=s)
        created = await manage.ainvoke({"content": "Ann prefers green tea", "action": "create"})
        memory_id = created.rsplit(" ", 1)[1]
        update = {"content": "Ann prefers oolong tea", "action": "update", "id": memory_id}
        await manage.ainvoke(update)
        await manage.ainvoke({"content": "Bo plays chess", "action": "create"})
        return memory_id, json.loads(await search.ainvoke({"query": "tea", "limit": 5}))

    memory_id, found = run_async(settings, scenario)
    check_langmem_found(found, memory_id)


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
