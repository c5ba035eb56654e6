"""The LangGraph store door: ZettelqStore against real Redis and the real worker code (the
in-thread search server organises what a read waits for), through langgraph-checkpoint's own
BaseStore methods: the mapping onto notes, put/get/delete, batches, organisation, limits. The
behaviours are LangGraph's own store tests' (InMemory and Postgres stores), written anew.
test_langgraph_search.py covers search and list_namespaces, test_langgraph_graph.py the async
twin, compiled graphs and LangMem."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import msgpack
import pytest
from pydantic import SecretStr

pytest.importorskip("langgraph.store.base", reason="needs the langgraph extra")

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    PutOp,
    SearchOp,
)
from redis import Redis

from producer import Backpressure, InvalidInput, MemoryClient
from producer.adapters.langgraph import ZettelqStore
from producer.adapters.langgraph.mapping import (
    decode_namespace,
    encode_namespace,
    note_id,
)
from producer.adapters.langgraph.query import plan_reads
from producer.keys import Keys
from tests.conftest import drain_all, make_settings
from worker.context import WorkerContext
from worker.runtime import organiser
from worker.runtime.servers import SearchServer


@pytest.fixture
def store(server: SearchServer, client: MemoryClient) -> Iterator[ZettelqStore]:
    s = ZettelqStore(client)
    yield s
    s.close()


@pytest.fixture
def idle_store(client: MemoryClient) -> Iterator[ZettelqStore]:
    """A store with no worker: for what must be refused before anything reaches Redis."""
    s = ZettelqStore(client)
    yield s
    s.close()


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


def test_a_namespace_too_long_to_encode_is_refused_with_a_clear_error(idle_store):
    with pytest.raises(InvalidInput, match="limit is 128"):
        idle_store.put(("ü" * 30,), "k", {"a": 1})
    assert idle_store.get(("ü" * 30,), "k") is None


@pytest.mark.parametrize("namespace", [(), ("langgraph", "x"), ("a.b",), ("",), ("a\x00",)])
def test_put_refuses_the_namespaces_langgraph_refuses(idle_store, namespace):
    with pytest.raises(InvalidNamespaceError):
        idle_store.put(namespace, "k", {"a": 1})


def test_batch_ops_are_checked_before_anything_is_written(idle_store, client, redis_db):
    with pytest.raises(InvalidNamespaceError):
        idle_store.batch([PutOp(("ok",), "k", {"a": 1}), PutOp(("bad.label",), "k", {"a": 1})])
    with pytest.raises(InvalidInput):
        idle_store.batch([PutOp(("ok",), "k", {"a": 1}), PutOp(("ok",), "j", {"x": {1, 2}})])
    keys = client.keys
    assert redis_db.xlen(keys.inbox(keys.shard_of("ok"))) == 0
    assert not redis_db.exists(keys.langgraph_namespaces())


def test_ttl_is_not_supported(idle_store):
    assert idle_store.supports_ttl is False
    with pytest.raises(NotImplementedError):
        idle_store.put(("a",), "k", {"a": 1}, ttl=5)
    with pytest.raises(NotImplementedError):
        idle_store.batch([PutOp(("a",), "k", {"a": 1}, ttl=5.0)])


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


def test_a_value_that_is_not_json_is_refused(idle_store):
    with pytest.raises(InvalidInput, match="JSON"):
        idle_store.put(("a",), "k", {"when": datetime.now(UTC)})
    with pytest.raises(InvalidInput, match="JSON"):
        idle_store.put(("a",), "k", {"x": float("nan")})


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
    runs = organiser.organise(ctx, encode_namespace(ns), None, time.time() + 30)
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


def test_a_read_flushes_the_gets_namespaces_the_dirty_ones_a_search_covers_or_all_for_a_list():
    dirty = ["one", "one.sub", "two"]
    get = GetOp(("three",), "k")
    assert plan_reads([get]).touched(dirty) == ["three"]
    assert plan_reads([get, SearchOp(("one",))]).touched(dirty) == ["three", "one", "one.sub"]
    assert plan_reads([SearchOp(("one",)), ListNamespacesOp()]).touched(dirty) == dirty


def test_a_search_sees_its_own_writes_and_a_list_all_of_them(store):
    store.put(("one",), "k", {"v": 1})
    store.put(("two",), "k", {"v": 2})
    assert [i.value for i in store.search(("one",))] == [{"v": 1}]
    assert store.list_namespaces() == [("one",), ("two",)]


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


def test_a_store_holding_namespace_keys_sees_only_those_namespaces(tmp_path, redis_db):
    settings = make_settings(tmp_path)
    keyed = settings.model_copy(update={"namespace_keys": {"tenant-a.notes": SecretStr("s")}})
    ctx = WorkerContext.build(settings)
    server = SearchServer(ctx).start()
    try:
        with MemoryClient(settings) as open_client, MemoryClient(keyed) as tenant_client:
            everyone, tenant = ZettelqStore(open_client), ZettelqStore(tenant_client)
            tenant.put(("tenant-a", "notes"), "k", {"text": "tea with a"})
            everyone.put(("tenant-b", "notes"), "k", {"text": "tea with b"})
            assert tenant.list_namespaces() == [("tenant-a", "notes")]  # flushes its write
            assert everyone.list_namespaces() == [("tenant-a", "notes"), ("tenant-b", "notes")]
            assert [i.namespace for i in tenant.search((), query="tea")] == [("tenant-a", "notes")]
            everyone.close()
            tenant.close()
    finally:
        server.stop()
        ctx.close()
