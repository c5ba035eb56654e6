from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.errors import ProtocolError
from producer.protocol import (
    COSINE_REASON,
    LINK_HEAD,
    PROTOCOL_VERSION,
    DeleteJob,
    Hit,
    JobHead,
    JobRun,
    Note,
    Reply,
    SearchJob,
    StoreJob,
    link_label,
    link_meta,
    link_packer,
    link_weight,
    link_weights,
    new_id,
    note_from_hash,
    pack,
    pack_link,
    unpack,
    unpack_link,
)
from worker.store.notes import encode_fields

NOW = 1_700_000_000.25


def a_hit(note_id: str = "n1", score: float = 0.5) -> Hit:
    return Hit(
        id=note_id,
        namespace="ns",
        content=f"content of {note_id}",
        score=score,
        relevance=0.9,
        similarity=0.8,
        importance=0.5,
        recency=0.9,
        connection_boost=1.1,
        hop=1,
        keywords=["alpha", "beta"],
        tags=["t"],
        links={"n2": 0.7},
        metadata={"source": "chat", "n": 3, "nested": {"x": [1, 2.5, None, True]}},
        agent="planner",
        created_at=NOW,
        event_time=NOW - 60,
    )


@pytest.mark.parametrize(
    "message",
    [
        StoreJob(
            id="n1",
            ns="ns",
            content="the customer's order shipped",
            agent="planner",
            metadata={"k": "v", "n": [1, 2]},
            tags=["orders"],
            event_time=NOW - 5,
            importance=0.7,
            created_at=NOW,
        ),
        StoreJob(id="n2", ns="ns", content="minimal", created_at=NOW),
        DeleteJob(id="n1", ns="ns", agent="cleaner", created_at=NOW),
        SearchJob(
            job_id="j1",
            kind="context",
            namespaces=["a", "b"],
            query="orders",
            k=5,
            hops=2,
            filters={"agent": "planner", "tags": ["orders"]},
            fresh=False,
            max_tokens=500,
            deadline=NOW + 10,
        ),
        Reply(job_id="j1", hits=[a_hit("n1", 0.9), a_hit("n2", 0.4)], text="ctx"),
        Reply(job_id="j2", ok=False, error="boom"),
    ],
    ids=lambda m: type(m).__name__,
)
def test_pack_then_unpack_gives_back_an_equal_message(message: Any) -> None:
    assert unpack(type(message), pack(message)) == message


@pytest.mark.parametrize(
    "message",
    [
        Reply(job_id="j1", hits=[a_hit("n1", 0.9), a_hit("n2", 0.4)], text="ctx"),
        Reply(job_id="j2", runs=[JobRun(job="evict", at=NOW, work=3, seconds=0.5)]),
        SearchJob(job_id="j3", namespaces=["a"], filters={"tags": ["x"]}, deadline=NOW),
        StoreJob(id="n1", ns="ns", content="c", metadata={"k": [1, {"a": None}]}, created_at=NOW),
    ],
    ids=lambda m: type(m).__name__,
)
def test_pack_writes_the_bytes_of_model_dump(message: Any) -> None:
    assert pack(message) == msgpack.packb(message.model_dump(), use_bin_type=True)


def test_a_reply_keeps_its_hits_in_order_with_every_field() -> None:
    reply = unpack(Reply, pack(Reply(job_id="j", hits=[a_hit("n1"), a_hit("n2")])))

    assert [h.id for h in reply.hits] == ["n1", "n2"]
    assert reply.hits[0] == a_hit("n1")
    assert reply.v == PROTOCOL_VERSION


def test_pack_accepts_a_plain_mapping() -> None:
    data = {"v": 1, "op": "delete", "id": "n1", "ns": "ns", "created_at": NOW}

    assert unpack(DeleteJob, pack(data)) == DeleteJob(id="n1", ns="ns", created_at=NOW)


def test_pack_of_an_unpackable_value_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="cannot pack"):
        pack({"v": 1, "bad": object()})


@pytest.mark.parametrize(
    "garbage",
    [b"", b"\xc1", b"\x92\x01", b"\xdd\xff\xff\xff\xff", b"\x81\x90\x01", b"not msgpack at all"],
)
def test_unpack_of_garbage_bytes_is_a_protocol_error(garbage: bytes) -> None:
    with pytest.raises(ProtocolError, match="cannot decode StoreJob"):
        unpack(StoreJob, garbage)


@pytest.mark.parametrize("value", [[1, 2, 3], "a string", 42, None, 1.5])
def test_unpack_of_a_non_map_is_a_protocol_error(value: object) -> None:
    with pytest.raises(ProtocolError):
        unpack(SearchJob, msgpack.packb(value))


def test_unpack_of_a_map_missing_required_fields_is_a_protocol_error() -> None:
    payload = pack({"v": 1, "op": "store", "ns": "ns", "content": "x"})  # no id, no created_at

    with pytest.raises(ProtocolError, match="StoreJob"):
        unpack(StoreJob, payload)


def test_unpack_of_a_field_of_the_wrong_type_is_a_protocol_error() -> None:
    payload = pack({"job_id": "j", "namespaces": "ns-not-a-list", "deadline": NOW})

    with pytest.raises(ProtocolError):
        unpack(SearchJob, payload)


def test_unpack_of_a_non_bytes_argument_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        unpack(StoreJob, None)  # type: ignore[arg-type]


def test_unpack_of_a_store_job_as_a_delete_job_is_a_protocol_error() -> None:
    payload = pack(StoreJob(id="n1", ns="ns", content="x", created_at=NOW))

    with pytest.raises(ProtocolError):
        unpack(DeleteJob, payload)


def test_unknown_extra_fields_are_ignored() -> None:
    data = {
        **StoreJob(id="n1", ns="ns", content="x", created_at=NOW).model_dump(),
        "added_by_a_newer_producer": {"anything": [1, 2]},
        "priority": 3,
    }

    job = unpack(StoreJob, pack(data))

    assert job == StoreJob(id="n1", ns="ns", content="x", created_at=NOW)
    assert not hasattr(job, "priority")


def test_job_head_reads_the_version_op_and_namespace_of_any_job() -> None:
    head = unpack(JobHead, pack(StoreJob(id="n1", ns="ns", content="x", created_at=NOW)))

    assert (head.v, head.op, head.ns) == (PROTOCOL_VERSION, "store", "ns")


def test_a_job_from_another_protocol_version_keeps_its_version() -> None:
    data = {**DeleteJob(id="n1", ns="ns", created_at=NOW).model_dump(), "v": 99}

    assert unpack(JobHead, pack(data)).v == 99


@given(st.binary(max_size=64))
def test_unpack_of_any_bytes_returns_or_raises_protocol_error(data: bytes) -> None:
    try:
        unpack(Reply, data)
    except ProtocolError:
        pass


def test_new_id_is_32_lowercase_hex_characters() -> None:
    note_id = new_id()

    assert len(note_id) == 32
    assert int(note_id, 16) >= 0
    assert note_id == note_id.lower()


def test_new_id_is_unique_over_many_calls() -> None:
    ids = [new_id() for _ in range(10_000)]

    assert len(set(ids)) == len(ids)


def test_new_ids_sort_by_creation_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(1_700_000_000_000_000_000, 1_700_000_001_000_000_000, 2_000_000))
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))

    ids = [new_id() for _ in range(200)]  # each 2 ms after the one before

    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_new_id_starts_with_the_milliseconds_since_the_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_123_456_789)

    assert int(new_id()[:12], 16) == 1_700_000_000_123


def redis_hash(fields: dict[str, Any]) -> dict[bytes, bytes]:
    """What HGETALL returns for a hash written with ``encode_fields``: bytes keys and values."""
    out: dict[bytes, bytes] = {}
    for key, value in encode_fields(fields).items():
        out[key.encode()] = value if isinstance(value, bytes) else str(value).encode()
    return out


def written_note() -> dict[str, Any]:
    """A note's fields as worker/intake/commit.py writes them."""
    return {
        "id": "n1",
        "namespace": "ns",
        "content": "the customer's order shipped",
        "kind": "note",
        "keywords": ["customer", "order", "shipped"],
        "tags": ["orders", "customer"],
        "context": "",
        "metadata": {"source": "chat", "n": 3, "nested": {"x": [1, 2.5, None]}},
        "agent": "planner",
        "created_at": NOW,
        "event_time": NOW - 3600,
        "importance": 0.7,
        "access_count": 4,
        "last_access": NOW + 10,
        "status": "active",
        "version": 2,
        "embedder": "hash-256",
        "seq": 17,
        "src": "1700000000000-0",
        "updated_at": NOW + 20,
    }


def test_note_from_hash_decodes_a_hash_as_the_worker_writes_it() -> None:
    raw = {**redis_hash(written_note()), b"vec": b"\x00\x01\x02\x03"}

    note = note_from_hash(raw, {"n2": 0.8, "n3": 0.25})

    assert note == Note(
        id="n1",
        namespace="ns",
        content="the customer's order shipped",
        keywords=["customer", "order", "shipped"],
        tags=["orders", "customer"],
        metadata={"source": "chat", "n": 3, "nested": {"x": [1, 2.5, None]}},
        agent="planner",
        created_at=NOW,
        event_time=NOW - 3600,
        importance=0.7,
        access_count=4,
        last_access=NOW + 10,
        status="active",
        version=2,
        embedder="hash-256",
        seq=17,
        links={"n2": 0.8, "n3": 0.25},
    )


def test_note_from_hash_decodes_packed_nones() -> None:
    fields = {**written_note(), "agent": None, "event_time": None, "valid_to": None}

    note = note_from_hash(redis_hash(fields))

    assert (note.agent, note.event_time, note.valid_to) == (None, None, None)
    assert note.links == {}


def test_note_from_hash_reads_a_tombstoned_note() -> None:
    fields = {**written_note(), "status": "tombstoned", "valid_to": NOW + 99}

    note = note_from_hash(redis_hash(fields))

    assert note.status == "tombstoned"
    assert note.valid_to == NOW + 99


def test_note_from_hash_of_a_hash_missing_its_id_is_a_protocol_error() -> None:
    fields = written_note()
    del fields["id"]

    with pytest.raises(ProtocolError, match="cannot decode note"):
        note_from_hash(redis_hash(fields))


def test_note_from_hash_of_a_bad_status_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        note_from_hash(redis_hash({**written_note(), "status": "weird"}))


@given(
    weight=st.floats(allow_nan=False, allow_infinity=False),
    reason=st.text(max_size=80),
    label=st.sampled_from(["related", "supports", "sequence"]),
)
def test_a_packed_link_gives_back_its_exact_weight_and_metadata(
    weight: float, reason: str, label: str
) -> None:
    meta = {"reason": reason, "label": label, "source": "rule:similarity", "at": 1.5}
    raw = pack_link(weight, meta)
    assert link_weight(raw) == weight
    assert link_label(raw) == label
    assert unpack_link(raw) == (weight, meta)
    assert link_meta(raw) == meta
    assert pack_link(*unpack_link(raw)) == raw  # what a revert writes back is what was there


@given(
    weight=st.floats(allow_nan=False),
    reason=st.text(max_size=300),
    label=st.sampled_from(["related", "sequence", "", "über"]),
    source=st.sampled_from(["rule:similarity", "rule:sequence", "model:x", ""]),
)
def test_a_link_packer_packs_what_pack_link_packs(
    weight: float, reason: str, label: str, source: str
) -> None:
    meta = {"reason": reason, "label": label, "source": source, "at": NOW}
    assert link_packer(source, NOW)(weight, reason, label) == pack_link(weight, meta)


def test_a_link_without_a_label_reads_as_related_and_no_link_as_nothing() -> None:
    assert link_meta(pack_link(0.5, {"reason": "old"})) == {"reason": "old", "label": "related"}
    assert link_label(pack_link(0.5, {"reason": "old"})) == "related"
    assert link_meta(pack_link(0.5, {})) == {}
    assert (link_meta(None), link_label(None)) == ({}, "")
    assert unpack_link(pack_link(0.25, {})) == (0.25, {})
    assert unpack_link(pack_link(0.25, {"label": "über"})) == (0.25, {"label": "über"})


def test_a_link_keeps_its_common_metadata_by_position_and_an_older_map_still_reads() -> None:
    meta = {"reason": "cosine 0.28; shared kouckhou", "source": "rule:similarity", "at": 1.5}
    raw = pack_link(0.28, {**meta, "label": "related"})
    named = LINK_HEAD.pack(0.28, 7) + b"related" + msgpack.packb(meta)
    # the default label, the three names, the source's text and the cosine are not stored
    assert len(named) - len(raw) == 7 + 17 + 15 + len("cosine 0.28") - 1
    assert unpack_link(raw) == unpack_link(named) == (0.28, {**meta, "label": "related"})
    with_extra = pack_link(0.5, {"reason": "r", "why": "newer", "at": 2.0, "source": "llm:x"})
    assert unpack_link(with_extra) == (
        0.5,
        {"reason": "r", "why": "newer", "at": 2.0, "source": "llm:x", "label": "related"},
    )
    assert unpack_link(pack_link(0.5, {"source": "merge"})) == (
        0.5,
        {"source": "merge", "label": "related"},
    )
    assert pack_link(0.5, {}) == LINK_HEAD.pack(0.5, 0) + msgpack.packb([])
    unknown = LINK_HEAD.pack(0.5, 0) + msgpack.packb([None, 99])  # from a newer version
    assert unpack_link(unknown)[1]["source"] == "99"


@given(
    weight=st.floats(allow_nan=False),
    tail=st.text(max_size=80),
    label=st.sampled_from(["related", "sequence", "", "über"]),
)
def test_a_reason_that_repeats_the_weight_or_the_label_is_kept_short_and_reads_whole(
    weight: float, tail: str, label: str
) -> None:
    for reason in (COSINE_REASON.format(weight) + tail, label or "related"):
        meta = {"reason": reason, "label": label or "related", "source": "rule:sequence", "at": NOW}
        raw = pack_link(weight, meta)
        assert len(raw) < len(pack_link(weight, {**meta, "reason": "x" + reason}))
        assert unpack_link(raw) == (weight, meta)
        assert pack_link(*unpack_link(raw)) == raw


def test_reasons_written_in_full_by_the_previous_layout_read_the_same() -> None:
    full = ["cosine 0.28; shared kouckhou", 0, 1.5]  # every reason as text
    raw = LINK_HEAD.pack(0.28, 0) + msgpack.packb(full)
    seq = LINK_HEAD.pack(1.0, 8) + b"sequence" + msgpack.packb(["sequence", 1, 1.5])
    assert unpack_link(raw) == unpack_link(pack_link(*unpack_link(raw)))
    assert unpack_link(raw)[1]["reason"] == "cosine 0.28; shared kouckhou"
    assert unpack_link(seq)[1] == {
        "label": "sequence",
        "reason": "sequence",
        "source": "rule:sequence",
        "at": 1.5,
    }


def test_a_reason_of_another_cosine_is_kept_as_text_and_a_reason_that_is_not_text_refused() -> None:
    raw = pack_link(0.9, {"reason": "cosine 0.28; shared kouckhou"})  # the weight moved on
    assert b"cosine 0.28" in raw and unpack_link(raw)[1]["reason"] == "cosine 0.28; shared kouckhou"
    for reason in (True, ["x"]):
        with pytest.raises(ValueError, match="reason is text"):
            pack_link(0.5, {"reason": reason})


def test_a_link_label_past_255_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="255 bytes"):
        pack_link(0.5, {"label": "x" * 256})


def test_link_weights_reads_a_links_hash_in_either_reply_shape() -> None:
    a, b = pack_link(0.5, {"reason": "x"}), pack_link(0.75, {})
    assert link_weights({b"n1": a, b"n2": b}) == {"n1": 0.5, "n2": 0.75}  # RESP3 map
    assert link_weights([b"n1", a, b"n2", b]) == {"n1": 0.5, "n2": 0.75}  # RESP2 flat
