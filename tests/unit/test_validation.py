from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producer import validation as v
from producer.core import ClientCore
from producer.errors import InvalidInput
from producer.protocol import SearchJob, StoreJob, new_id, unpack
from producer.settings import ProducerSettings
from tests.strategies import anything, metadatas, names, store_fields, tag_lists, texts, times
from worker.intake.drain import decode_job
from worker.settings import WorkerSettings


def raises_invalid(match: str) -> Any:
    """InvalidInput (which is also a ValueError) whose message matches ``match``."""
    return pytest.raises(InvalidInput, match=match)


def test_invalid_input_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="namespace"):
        v.check_namespace("")


# namespace and id


@pytest.mark.parametrize(
    "namespace", ["default", "a", "agents/alice", "team.b:notes", "me@host", "x-y_z", "a" * 128]
)
def test_check_namespace_accepts_good_names(namespace: str) -> None:
    assert v.check_namespace(namespace) == namespace


@pytest.mark.parametrize(
    "namespace",
    ["", "a" * 129, "{ns}", "a{b", "a}b", "with space", "tab\there", "caf\u00e9", None, 5, b"ns"],
)
def test_check_namespace_rejects_bad_names(namespace: object) -> None:
    with raises_invalid("namespace"):
        v.check_namespace(namespace)


@pytest.mark.parametrize("check", [v.check_namespace, v.check_id])
def test_a_trailing_newline_is_rejected(check: Any) -> None:
    with pytest.raises(InvalidInput):
        check("name\n")


@pytest.mark.parametrize("note_id", ["n1", "a" * 128, "A-Z_0.9:x", new_id()])
def test_check_id_accepts_good_ids(note_id: str) -> None:
    assert v.check_id(note_id) == note_id


@pytest.mark.parametrize("note_id", ["", "a" * 129, "a/b", "a b", "{x}", "a@b", None, 7, b"n1"])
def test_check_id_rejects_bad_ids(note_id: object) -> None:
    with raises_invalid("id"):
        v.check_id(note_id)


# text and agent


@pytest.mark.parametrize("text", ["x", " padded ", "caf\u00e9 \u2603", "a" * 100])
def test_check_text_accepts_non_empty_text_within_the_limit(text: str) -> None:
    assert v.check_text(text, "content", 100) == text


def test_check_text_counts_utf8_bytes_not_characters() -> None:
    assert v.check_text("\u00e9" * 50, "content", 100)
    with raises_invalid(r"content is 102 bytes; the limit is 100"):
        v.check_text("\u00e9" * 51, "content", 100)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "content must be a str"),
        (b"bytes", "content must be a str"),
        (12, "content must be a str"),
        ("", "content must not be empty"),
        (" \n\t", "content must not be empty"),
        ("a\x00b", "content must not contain NUL"),
        ("lone \ud800 surrogate", "content is not valid Unicode"),
    ],
)
def test_check_text_rejects_bad_text_naming_the_argument(text: object, message: str) -> None:
    with raises_invalid(message):
        v.check_text(text, "content", 100)


def test_check_agent_accepts_none_and_names() -> None:
    assert v.check_agent(None) is None
    assert v.check_agent("planner") == "planner"
    assert v.check_agent("a" * v.MAX_AGENT_CHARS) == "a" * v.MAX_AGENT_CHARS


@pytest.mark.parametrize("agent", ["", "   ", "a" * (v.MAX_AGENT_CHARS + 1), 5, b"x", "a\x00"])
def test_check_agent_rejects_bad_agents(agent: object) -> None:
    with raises_invalid("agent"):
        v.check_agent(agent)


# metadata


def test_check_metadata_accepts_none_as_empty() -> None:
    assert v.check_metadata(None, 100) == {}


def test_check_metadata_returns_a_plain_json_like_copy() -> None:
    metadata = {"s": "x", "n": 1, "f": 1.5, "b": True, "none": None, "t": (1, 2), "d": {"k": [3]}}

    out = v.check_metadata(metadata, 1_000)

    assert out == {
        "s": "x",
        "n": 1,
        "f": 1.5,
        "b": True,
        "none": None,
        "t": [1, 2],
        "d": {"k": [3]},
    }
    assert out is not metadata


@pytest.mark.parametrize(
    "metadata",
    [["a", "b"], "text", 5, {1: "int key"}, {b"k": "bytes key"}],
)
def test_check_metadata_rejects_non_mappings_and_non_str_keys(metadata: object) -> None:
    with raises_invalid("metadata must be a mapping with str keys"):
        v.check_metadata(metadata, 1_000)


@pytest.mark.parametrize(
    "metadata", [{"o": object()}, {"s": {1, 2}}, {"big": 2**64}, {"dt": datetime(2024, 1, 1)}]
)
def test_check_metadata_rejects_values_msgpack_cannot_carry(metadata: dict[str, Any]) -> None:
    with raises_invalid("metadata values must be JSON-like"):
        v.check_metadata(metadata, 1_000)


def test_check_metadata_enforces_the_packed_size_limit() -> None:
    # fixmap header (1) + "k" (2) + str8 header (2) + 95 bytes = 100 packed bytes
    at_limit = {"k": "x" * 95}

    assert v.check_metadata(at_limit, 100) == at_limit
    with raises_invalid(r"metadata is 101 packed bytes; the limit is 100"):
        v.check_metadata({"k": "x" * 96}, 100)


def test_check_metadata_rejects_nested_int_keys_with_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        v.check_metadata({"a": {1: 2}}, 1_000)


# tags


def test_check_tags_accepts_none_as_empty() -> None:
    assert v.check_tags(None, 4, 8) == []


def test_check_tags_strips_and_dedupes_keeping_first_order() -> None:
    assert v.check_tags(["b", " a ", "b", "a", "c"], 5, 8) == ["b", "a", "c"]


def test_check_tags_accepts_a_tuple() -> None:
    assert v.check_tags(("x", "y"), 4, 8) == ["x", "y"]


def test_check_tags_enforces_the_count_limit() -> None:
    assert v.check_tags(["a", "b", "c"], 3, 8) == ["a", "b", "c"]
    with raises_invalid(r"4 tags; the limit is 3"):
        v.check_tags(["a", "b", "c", "d"], 3, 8)


def test_check_tags_enforces_the_length_limit() -> None:
    assert v.check_tags(["x" * 8], 3, 8) == ["x" * 8]
    with raises_invalid("each tag must be a non-empty str of at most 8 characters"):
        v.check_tags(["x" * 9], 3, 8)


@pytest.mark.parametrize("tags", ["a-str", {"a": 1}, 5, {"a", "b"}])
def test_check_tags_rejects_non_lists(tags: object) -> None:
    with raises_invalid("tags must be a list of str"):
        v.check_tags(tags, 4, 8)


@pytest.mark.parametrize("tags", [[""], ["  "], [1], [None], ["a\x00"], [b"x"], b"ab"])
def test_check_tags_rejects_bad_tags(tags: object) -> None:
    with raises_invalid("tag"):
        v.check_tags(tags, 4, 8)


# time


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (0, 0.0),
        (1_700_000_000, 1_700_000_000.0),
        (1_700_000_000.5, 1_700_000_000.5),
        (-86_400, -86_400.0),
        (datetime(2024, 1, 2, 3, 4, 5), 1_704_164_645.0),
        (datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), 1_704_164_645.0),
        (datetime(2024, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))), 1_704_164_645.0),
        ("2024-01-02T03:04:05", 1_704_164_645.0),
        ("2024-01-02T03:04:05Z", 1_704_164_645.0),
        ("2024-01-02T05:04:05+02:00", 1_704_164_645.0),
        ("2024-01-02", 1_704_153_600.0),
    ],
)
def test_check_time_accepts_epoch_seconds_datetimes_and_iso_strings(
    value: object, expected: float | None
) -> None:
    assert v.check_time(value, "event_time") == expected


def test_check_time_treats_a_naive_datetime_as_utc() -> None:
    naive = datetime(2024, 6, 1, 12, 0)

    assert v.check_time(naive, "t") == v.check_time(naive.replace(tzinfo=UTC), "t")


def test_check_time_rejects_milliseconds() -> None:
    with raises_invalid(r"event_time must be epoch seconds .*milliseconds"):
        v.check_time(1_700_000_000_000, "event_time")


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, True, False, [2024], {"t": 1}, b"2024-01-01"]
)
def test_check_time_rejects_non_times(value: object) -> None:
    with raises_invalid("event_time must be a datetime, ISO 8601 str or epoch seconds"):
        v.check_time(value, "event_time")


@pytest.mark.parametrize("value", ["yesterday", "", "2024-13-01", "1700000000"])
def test_check_time_rejects_strings_that_are_not_iso_8601(value: str) -> None:
    with raises_invalid("since is not an ISO 8601 date/time"):
        v.check_time(value, "since")


def test_check_time_rejects_a_huge_int_with_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        v.check_time(10**400, "event_time")


# numbers


@pytest.mark.parametrize(("value", "expected"), [(None, None), (0, 0.0), (1, 1.0), (0.25, 0.25)])
def test_check_unit_float_accepts_none_and_zero_to_one(
    value: object, expected: float | None
) -> None:
    assert v.check_unit_float(value, "importance") == expected


@pytest.mark.parametrize("value", [-0.01, 1.01, math.nan, math.inf, True, "0.5"])
def test_check_unit_float_rejects_the_rest(value: object) -> None:
    with raises_invalid("importance must be a number between 0 and 1"):
        v.check_unit_float(value, "importance")


@pytest.mark.parametrize("value", [1, 5, 10])
def test_check_int_accepts_ints_in_range(value: int) -> None:
    assert v.check_int(value, "k", 1, 10) == value


@pytest.mark.parametrize("value", [0, 11, -1, 3.0, True, "3", None])
def test_check_int_rejects_the_rest(value: object) -> None:
    with raises_invalid("k must be an int between 1 and 10"):
        v.check_int(value, "k", 1, 10)


@pytest.mark.parametrize("value", [0.001, 1, 10.5, v.MAX_TIMEOUT_S])
def test_check_timeout_accepts_positive_seconds_up_to_the_maximum(value: float) -> None:
    assert v.check_timeout(value) == float(value)


@pytest.mark.parametrize("value", [0, -1, v.MAX_TIMEOUT_S + 1, math.nan, math.inf, True, "5", None])
def test_check_timeout_rejects_the_rest(value: object) -> None:
    with raises_invalid("timeout_s must be"):
        v.check_timeout(value)


# filters


def test_check_filters_accepts_none_as_empty() -> None:
    assert v.check_filters(None, ProducerSettings()) == {}


def test_check_filters_normalises_every_filter() -> None:
    filters = {
        "agent": "planner",
        "kind": "insight",
        "tags": ["a", " a", "b"],
        "since": "2024-01-02T03:04:05Z",
        "until": 1_704_164_646,
        "metadata": {"k": (1, 2)},
    }

    assert v.check_filters(filters, ProducerSettings()) == {
        "agent": "planner",
        "kind": "insight",
        "tags": ["a", "b"],
        "since": 1_704_164_645.0,
        "until": 1_704_164_646.0,
        "metadata": {"k": [1, 2]},
    }


def test_check_filters_drops_empty_filters() -> None:
    filters = {"agent": None, "tags": [], "since": None, "metadata": {}}

    assert v.check_filters(filters, ProducerSettings()) == {}


@pytest.mark.parametrize("filters", [{"nope": 1}, ["agent"], "agent"])
def test_check_filters_rejects_unknown_keys_and_non_mappings(filters: object) -> None:
    with raises_invalid("filters must be a mapping with keys among"):
        v.check_filters(filters, ProducerSettings())


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"agent": ""}, "filters\\['agent'\\] must not be empty"),
        ({"kind": 3}, "filters\\['kind'\\] must be a str"),
        ({"tags": "a"}, "tags must be a list"),
        ({"since": 1_700_000_000_000}, "filters\\['since'\\] must be epoch seconds"),
        ({"until": "soon"}, "filters\\['until'\\] is not an ISO 8601"),
        ({"metadata": [1]}, "metadata must be a mapping"),
    ],
)
def test_check_filters_rejects_bad_values_naming_the_filter(
    filters: dict[str, Any], message: str
) -> None:
    with raises_invalid(message):
        v.check_filters(filters, ProducerSettings())


# property: whatever the producer accepts, the worker accepts

LIMITS: dict[str, Any] = {
    "max_content_bytes": 64,
    "max_metadata_bytes": 200,
    "max_tags": 3,
    "max_tag_chars": 8,
    "max_k": 50,
}
PRODUCER = ClientCore(ProducerSettings(**LIMITS))
WORKER_CTX = SimpleNamespace(settings=WorkerSettings(**LIMITS))


def test_a_store_without_metadata_passes_the_worker_when_metadata_is_disabled() -> None:
    limits = {**LIMITS, "max_metadata_bytes": 0}
    _, payload = ClientCore(ProducerSettings(**limits)).store_payload("hello", "ns")

    ctx = SimpleNamespace(settings=WorkerSettings(**limits))
    assert decode_job(ctx, {b"j": payload}).content == "hello"  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    content=st.text(min_size=1, max_size=40) | texts | st.none() | st.integers() | st.binary(),
    namespace=st.none() | names,
    fields=store_fields,
)
def test_store_payload_accepts_only_what_the_worker_accepts(
    content: object, namespace: str | None, fields: dict[str, Any]
) -> None:
    try:
        ns = PRODUCER.namespace(namespace)  # as MemoryClient.store does before store_payload
        note_id, payload = PRODUCER.store_payload(content, ns, **fields)
    except InvalidInput:
        return

    job = unpack(StoreJob, payload)
    decoded = decode_job(WORKER_CTX, {b"j": payload})  # type: ignore[arg-type]

    assert decoded == job
    assert (job.id, job.ns, job.content) == (note_id, ns, content)


search_fields = st.fixed_dictionaries(
    {},
    optional={
        "k": st.integers(1, LIMITS["max_k"]) | anything,
        "hops": st.integers(0, v.MAX_HOPS) | anything,
        "max_tokens": st.integers(16, 10**6) | anything,
        "fresh": anything,
        "timeout_s": st.floats(0.001, v.MAX_TIMEOUT_S) | anything,
        "filters": st.none()
        | st.dictionaries(
            st.sampled_from(sorted(v.FILTER_KEYS)),
            times | tag_lists | metadatas | texts,
            max_size=4,
        )
        | st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)
        | st.text(max_size=3),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["search", "context", "flush"]),
    namespace=st.none() | names | st.lists(st.none() | names | st.integers(), max_size=18),
    query=st.text(min_size=1, max_size=40) | texts | st.none() | st.integers(),
    fields=search_fields,
)
def test_search_job_returns_a_valid_job_or_raises_invalid_input(
    kind: str, namespace: Any, query: object, fields: dict[str, Any]
) -> None:
    if kind != "flush":  # flush() never passes a query
        fields["query"] = query
    try:
        job = PRODUCER.search_job(kind, namespace, **fields)
    except InvalidInput:
        return

    assert isinstance(job, SearchJob)
    assert 1 <= len(job.namespaces) <= 16
    assert len(set(job.namespaces)) == len(job.namespaces)
    assert 1 <= job.k <= LIMITS["max_k"]


# what the producer accepts, every read path can render


@pytest.mark.parametrize(
    "value",
    [
        datetime(9999, 12, 31, tzinfo=UTC),
        datetime(1, 1, 1, 12, tzinfo=timezone(timedelta(hours=14))),
        "9999-12-31T23:59:59-12:00",
        -1e11,
    ],
)
def test_check_time_rejects_times_that_cannot_render_as_dates(value: object) -> None:
    with pytest.raises(InvalidInput, match="event_time"):
        v.check_time(value, "event_time")


def test_check_time_accepts_the_ends_of_its_range() -> None:
    assert v.check_time(v.MIN_EPOCH_S, "t") == v.MIN_EPOCH_S
    assert v.check_time(v.MAX_EPOCH_S, "t") == v.MAX_EPOCH_S
    for edge in (v.MIN_EPOCH_S, v.MAX_EPOCH_S):
        for hours in (-14, 14):
            datetime.fromtimestamp(edge + hours * 3600, UTC).strftime("%Y-%m-%d %H:%M")


def _nested(depth: int) -> dict[str, Any]:
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return {"k": value}


def test_check_metadata_bounds_nesting_depth() -> None:
    assert v.check_metadata(_nested(v.MAX_METADATA_DEPTH), 1_000)
    with raises_invalid(f"nested deeper than {v.MAX_METADATA_DEPTH} levels"):
        v.check_metadata(_nested(v.MAX_METADATA_DEPTH + 1), 1_000)


def test_check_metadata_refuses_deep_nesting_without_recursing_into_it() -> None:
    with raises_invalid("nested deeper"):
        v.check_metadata(_nested(5_000), 10**9)


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"b": b"\x00\x01"}, r"metadata\['b'\] is a bytes"),
        ({"f": math.nan}, r"metadata\['f'\] is nan"),
        ({"l": [1, math.inf]}, r"metadata\['l'\]\[1\] is inf"),
        ({"d": {"s": "\ud800"}}, "lone surrogate"),
        ({"d": {b"k": 1}}, "has a bytes key"),
    ],
)
def test_check_metadata_rejects_what_json_cannot_carry(
    metadata: dict[str, Any], where: str
) -> None:
    with raises_invalid(where):
        v.check_metadata(metadata, 1_000)
