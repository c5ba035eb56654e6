from __future__ import annotations

import time

import pytest

from producer.core import STORE_FIELDS, ClientCore
from producer.errors import InvalidInput, JobFailed, ProtocolError, ReplyTimeout
from producer.keys import Keys
from producer.protocol import DeleteJob, Hit, Reply, StoreJob, pack, unpack
from producer.settings import ProducerSettings


def core(**overrides: object) -> ClientCore:
    return ClientCore(ProducerSettings(**overrides))  # type: ignore[arg-type]


def a_hit(note_id: str) -> Hit:
    return Hit(
        id=note_id,
        namespace="ns",
        content="c",
        score=0.5,
        similarity=0.5,
        importance=0.5,
        recency=1.0,
        connection_boost=1.0,
    )


def test_the_core_builds_keys_from_its_settings() -> None:
    c = core(key_prefix="app", shard_count=4)

    assert isinstance(c.keys, Keys)
    assert (c.keys.prefix, c.keys.shard_count) == ("app", 4)


def test_namespace_falls_back_to_the_default_and_is_validated() -> None:
    c = core(default_namespace="home")

    assert c.namespace(None) == "home"
    assert c.namespace("") == "home"
    assert c.namespace("work") == "work"
    with pytest.raises(InvalidInput, match="namespace"):
        c.namespace("{bad}")


# store


def test_store_payload_fills_a_new_id_and_created_at() -> None:
    before = time.time()

    note_id, payload = core().store_payload("hello", "ns")

    job = unpack(StoreJob, payload)
    assert len(note_id) == 32 and job.id == note_id
    assert before <= job.created_at <= time.time()
    assert (job.v, job.op, job.ns, job.content) == (1, "store", "ns", "hello")
    assert (job.agent, job.metadata, job.tags, job.event_time, job.importance) == (
        None,
        {},
        [],
        None,
        None,
    )


def test_store_payload_gives_each_call_its_own_id() -> None:
    c = core()

    assert c.store_payload("a", "ns")[0] != c.store_payload("a", "ns")[0]


def test_store_payload_honours_a_caller_id() -> None:
    note_id, payload = core().store_payload("hello", "ns", id="my-note.1")

    assert note_id == "my-note.1"
    assert unpack(StoreJob, payload).id == "my-note.1"


def test_store_payload_treats_a_none_id_as_absent() -> None:
    note_id, _ = core().store_payload("hello", "ns", id=None)

    assert len(note_id) == 32


def test_store_payload_validates_the_caller_id() -> None:
    with pytest.raises(InvalidInput, match="id must be"):
        core().store_payload("hello", "ns", id="has space")


def test_store_payload_carries_every_field_normalised() -> None:
    _, payload = core().store_payload(
        "hello",
        "ns",
        agent="planner",
        metadata={"k": (1, 2)},
        tags=["a", " a", "b"],
        event_time="2024-01-02T03:04:05Z",
        importance=1,
    )

    job = unpack(StoreJob, payload)
    assert job.agent == "planner"
    assert job.metadata == {"k": [1, 2]}
    assert job.tags == ["a", "b"]
    assert job.event_time == 1_704_164_645.0
    assert job.importance == 1.0


@pytest.mark.parametrize(
    ("content", "fields", "message"),
    [
        ("", {}, "content must not be empty"),
        ("x" * 11, {}, "content is 11 bytes; the limit is 10"),
        ("ok", {"agent": ""}, "agent"),
        ("ok", {"metadata": {"k": "x" * 20}}, "metadata is"),
        ("ok", {"tags": ["a", "b", "c"]}, "3 tags; the limit is 2"),
        ("ok", {"event_time": 1_700_000_000_000}, "milliseconds"),
        ("ok", {"importance": 2}, "importance must be"),
    ],
)
def test_store_payload_enforces_the_settings_limits(
    content: str, fields: dict[str, object], message: str
) -> None:
    c = core(max_content_bytes=10, max_metadata_bytes=16, max_tags=2)

    with pytest.raises(InvalidInput, match=message):
        c.store_payload(content, "ns", **fields)


def test_store_many_payloads_takes_str_and_dict_items_in_order() -> None:
    ids, payloads = core().store_many_payloads(
        ["first", {"content": "second", "id": "n2", "tags": ["t"]}, {"content": "third"}], "ns"
    )

    jobs = [unpack(StoreJob, p) for p in payloads]
    assert [j.content for j in jobs] == ["first", "second", "third"]
    assert [j.id for j in jobs] == ids
    assert ids[1] == "n2"
    assert jobs[1].tags == ["t"]
    assert len(set(ids)) == 3


def test_store_many_payloads_rejects_duplicate_ids() -> None:
    items = [{"content": "a", "id": "same"}, {"content": "b", "id": "same"}]

    with pytest.raises(InvalidInput, match="same id twice"):
        core().store_many_payloads(items, "ns")


def test_store_many_payloads_rejects_unknown_item_fields() -> None:
    with pytest.raises(InvalidInput, match=r"unknown item fields \['colour', 'size'\]"):
        core().store_many_payloads([{"content": "a", "colour": "red", "size": 1}], "ns")


def test_store_many_payloads_rejects_an_item_without_content() -> None:
    with pytest.raises(InvalidInput, match="content must be a str"):
        core().store_many_payloads([{"tags": ["t"]}], "ns")


def test_store_many_payloads_takes_up_to_max_batch_items() -> None:
    ids, payloads = core(max_batch=3).store_many_payloads(["a", "b", "c"], "ns")

    assert len(ids) == len(payloads) == 3


@pytest.mark.parametrize("items", [[], ["a", "b", "c", "d"]])
def test_store_many_payloads_rejects_empty_and_oversized_batches(items: list[str]) -> None:
    with pytest.raises(InvalidInput, match="store_many takes 1 to 3 items"):
        core(max_batch=3).store_many_payloads(items, "ns")


@pytest.mark.parametrize("items", ["a string", 5, None, {"content": "x"}])
def test_store_many_payloads_rejects_non_lists(items: object) -> None:
    with pytest.raises(InvalidInput, match="items must be a list"):
        core().store_many_payloads(items, "ns")  # type: ignore[arg-type]


def test_store_many_payloads_does_not_mutate_the_callers_items() -> None:
    item = {"content": "a", "id": "n1"}

    core().store_many_payloads([item], "ns")

    assert item == {"content": "a", "id": "n1"}


def test_store_fields_are_the_documented_keywords() -> None:
    assert {
        "content",
        "agent",
        "metadata",
        "tags",
        "event_time",
        "importance",
        "id",
    } == STORE_FIELDS


def test_delete_payload_builds_a_delete_job() -> None:
    job = unpack(DeleteJob, core().delete_payload("n1", "ns"))

    assert (job.op, job.id, job.ns) == ("delete", "n1", "ns")
    assert job.created_at > 0


def test_delete_payload_validates_the_id() -> None:
    with pytest.raises(InvalidInput, match="id must be"):
        core().delete_payload("a b", "ns")


# search


def test_search_job_defaults() -> None:
    c = core(default_namespace="home", reply_timeout_s=7.0)
    before = time.time()

    job = c.search_job("search", None, query="orders")

    assert len(job.job_id) == 32
    assert (job.kind, job.namespaces, job.query) == ("search", ["home"], "orders")
    assert (job.k, job.hops, job.filters, job.fresh, job.max_tokens) == (10, 1, {}, True, 2000)
    assert before + 7.0 <= job.deadline <= time.time() + 7.0


def test_search_job_takes_options() -> None:
    before = time.time()

    job = core().search_job(
        "context",
        "ns",
        query="q",
        k=3,
        hops=0,
        filters={"agent": "planner"},
        fresh=False,
        max_tokens=100,
        timeout_s=2.5,
    )

    assert (job.kind, job.k, job.hops, job.fresh, job.max_tokens) == ("context", 3, 0, False, 100)
    assert job.filters == {"agent": "planner"}
    assert before + 2.5 <= job.deadline <= time.time() + 2.5


def test_search_job_dedupes_namespaces_keeping_order() -> None:
    job = core(default_namespace="home").search_job(
        "search", ["b", "a", "b", None, "home"], query="q"
    )

    assert job.namespaces == ["b", "a", "home"]


def test_search_job_takes_sixteen_namespaces() -> None:
    names = [f"ns{i}" for i in range(16)]

    assert core().search_job("search", names, query="q").namespaces == names


@pytest.mark.parametrize("names", [[], [f"ns{i}" for i in range(17)]])
def test_search_job_rejects_no_or_more_than_sixteen_namespaces(names: list[str]) -> None:
    with pytest.raises(InvalidInput, match="1 to 16"):
        core().search_job("search", names, query="q")


def test_search_job_validates_each_namespace() -> None:
    with pytest.raises(InvalidInput, match="namespace"):
        core().search_job("search", ["ok", "{bad}"], query="q")


def test_search_job_rejects_an_int_namespace_with_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        core().search_job("search", 5, query="q")  # type: ignore[arg-type]


def test_search_job_with_a_small_max_k_works_without_an_explicit_k() -> None:
    assert core(max_k=5).search_job("search", None, query="q").k <= 5


@pytest.mark.parametrize("kind", ["search", "context"])
def test_search_and_context_need_a_query(kind: str) -> None:
    with pytest.raises(InvalidInput, match="query must not be empty"):
        core().search_job(kind, None, query="  ")


def test_flush_needs_no_query() -> None:
    job = core().search_job("flush", "ns", timeout_s=None)

    assert (job.kind, job.query, job.namespaces) == ("flush", "", ["ns"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"k": 0}, "k must be an int between 1 and 20"),
        ({"k": 21}, "k must be an int between 1 and 20"),
        ({"hops": 4}, "hops must be an int between 0 and 3"),
        ({"max_tokens": 15}, "max_tokens must be an int between 16"),
        ({"timeout_s": -1}, "timeout_s must be > 0"),
        ({"timeout_s": 301}, "timeout_s must be > 0 and <= 300"),
        ({"filters": {"colour": "red"}}, "filters must be a mapping with keys among"),
    ],
)
def test_search_job_validates_options(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        core(max_k=20).search_job("search", None, query="q", **fields)


# replies


def test_parse_reply_returns_the_reply() -> None:
    c = core()
    job = c.search_job("search", None, query="q")
    sent = Reply(job_id=job.job_id, hits=[a_hit("n1"), a_hit("n2")], text="t")

    reply = c.parse_reply((b"zq:reply:" + job.job_id.encode(), pack(sent)), job)

    assert reply == sent


def test_parse_reply_of_none_is_a_reply_timeout() -> None:
    c = core()
    job = c.search_job("search", None, query="q")

    with pytest.raises(ReplyTimeout, match=f"no reply to search job_id={job.job_id}") as info:
        c.parse_reply(None, job)
    assert isinstance(info.value, TimeoutError)


def test_parse_reply_of_a_failure_is_job_failed_with_its_reason() -> None:
    c = core()
    job = c.search_job("search", None, query="q")
    raw = (b"key", pack(Reply(job_id=job.job_id, ok=False, error="index exploded")))

    with pytest.raises(JobFailed, match="job failed: index exploded") as info:
        c.parse_reply(raw, job)
    assert info.value.reason == "index exploded"


def test_parse_reply_of_a_failure_without_a_reason_says_so() -> None:
    c = core()
    job = c.search_job("search", None, query="q")

    with pytest.raises(JobFailed) as info:
        c.parse_reply((b"key", pack(Reply(job_id=job.job_id, ok=False))), job)
    assert info.value.reason == "unknown error"


def test_parse_reply_of_garbage_is_a_protocol_error() -> None:
    c = core()
    job = c.search_job("search", None, query="q")

    with pytest.raises(ProtocolError):
        c.parse_reply((b"key", b"\xc1garbage"), job)
