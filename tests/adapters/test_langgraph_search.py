"""ZettelqStore's search and list_namespaces against real Redis and the real worker code:
prefixes on label boundaries, queries, filters, pages, index paths, namespace listing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("langgraph.store.base", reason="needs the langgraph extra")

from langgraph.store.base import (
    ListNamespacesOp,
    MatchCondition,
)

from producer import InvalidInput, MemoryClient
from producer.adapters.langgraph import ZettelqStore
from producer.adapters.langgraph.mapping import (
    encode_namespace,
    note_id,
)
from tests.conftest import drain_all
from worker.runtime.servers import SearchServer


@pytest.fixture
def store(server: SearchServer, client: MemoryClient) -> Iterator[ZettelqStore]:
    s = ZettelqStore(client)
    yield s
    s.close()


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


def test_match_condition_ops_given_to_batch_directly(store):
    seed_namespaces(store)
    op = ListNamespacesOp(
        match_conditions=(MatchCondition("prefix", ("a", "*")), MatchCondition("suffix", ("f",)))
    )
    assert store.batch([op])[0] == [("a", "b", "f"), ("a", "c", "f")]


def test_search_edge_cases(store):
    store.put(("e",), "k", {"text": "edge"})
    assert [i.score for i in store.search(("e",), query="")] == [None]
    assert store.search(("e",), query="edge", offset=5) == []
    assert store.search(("nothing",), query="edge") == []
    assert store.search(("e",), query="no word in any note at all")[0].key == "k"


def test_an_update_changes_what_the_item_is_found_by(store):
    store.put(("v",), "a", {"text": "zebra stripes"})
    store.put(("v",), "b", {"text": "zebra"})
    store.put(("v",), "b", {"text": "walrus tusks"})
    assert store.search(("v",), query="walrus", limit=1)[0].key == "b"
    assert store.search(("v",), query="zebra", limit=1)[0].key == "a"
