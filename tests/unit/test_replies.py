from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producer.errors import ProtocolError
from producer.protocol import Hit, JobRun, Reply, pack, unpack
from worker.search.replies import NUMBERS, PackedHit, pack_reply

words = st.text(max_size=12)
floats = st.floats(allow_nan=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | floats | words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=8,
)
hits = st.builds(
    PackedHit,
    id=words,
    namespace=words,
    content=st.text(max_size=300),
    score=floats,
    relevance=floats,
    similarity=floats,
    lexical=floats,
    importance=floats,
    recency=floats,
    connection_boost=floats,
    hop=st.integers(0, 3),
    kind=words,
    keywords=st.lists(words, max_size=4),
    tags=st.lists(words, max_size=4),
    links=st.dictionaries(words, floats, max_size=20),
    metadata=st.dictionaries(words, json_values, max_size=4),
    agent=st.none() | words,
    created_at=floats,
    event_time=st.none() | floats,
    valid_to=st.none() | floats,
    superseded_by=st.none() | words,
    link_labels=st.dictionaries(words, words, max_size=20),
)
numbers = st.fixed_dictionaries(
    {name: st.integers(0, 3) if name == "hop" else floats for name in NUMBERS}
)


#: a hit's fields that have no default
REQUIRED = {
    "id": "n1",
    "namespace": "ns",
    "content": "c",
    "score": 0.5,
    "similarity": 0.2,
    "importance": 0.5,
    "recency": 1.0,
    "connection_boost": 1.0,
}


def decoded(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


@settings(max_examples=150)
@given(st.lists(hits, max_size=12), st.text(max_size=40), st.lists(numbers, max_size=12))
def test_a_reply_packs_as_pack_does_first_and_from_its_hits_kept_parts(
    found: list[PackedHit], text: str, updates: list[dict[str, Any]]
) -> None:
    reply = Reply(job_id="j", hits=found, text=text)
    assert all(isinstance(h, PackedHit) for h in reply.hits)  # kept as they are, not rebuilt
    assert decoded(pack_reply(reply)) == decoded(pack(reply))
    copies = [h.model_copy(update=u) for h, u in zip(found, updates, strict=False)]
    again = Reply(job_id="j2", hits=copies + found[len(copies) :])
    assert decoded(pack_reply(again)) == decoded(pack(again))
    assert unpack(Reply, pack_reply(again)) == unpack(Reply, pack(again))


def test_a_copy_with_new_numbers_keeps_the_packed_fields_and_one_with_others_does_not() -> None:
    first = {"content": "the first content", "links": {"n2": 0.7}, "link_labels": {"n2": "x"}}
    hit = PackedHit(**{**REQUIRED, **first})
    pack_reply(Reply(job_id="j", hits=[hit]))
    kept = hit.__pydantic_private__
    assert kept is not None and kept["_rest"] is not None

    renumbered = hit.model_copy(update={"score": 0.9, "hop": 1})
    private = renumbered.__pydantic_private__
    assert private is not None and private["_rest"] is kept["_rest"]
    sent = unpack(Reply, pack_reply(Reply(job_id="j", hits=[renumbered]))).hits[0]
    assert (sent.score, sent.hop, sent.content) == (0.9, 1, "the first content")

    rewritten = hit.model_copy(update={"content": "another content"})
    sent = unpack(Reply, pack_reply(Reply(job_id="j", hits=[rewritten]))).hits[0]
    assert sent.content == "another content"


def test_replies_of_plain_hits_or_with_runs_are_packed_as_pack_does() -> None:
    plain, packed = Hit(**REQUIRED), PackedHit(**REQUIRED)
    runs = [JobRun(job="evolve", at=1.0, work=3, seconds=0.5)]
    for reply in (
        Reply(job_id="j", hits=[plain, packed]),
        Reply(job_id="j", hits=[packed], runs=runs),
        Reply(job_id="j", ok=False, error="refused"),
    ):
        assert pack_reply(reply) == pack(reply)


def test_a_hit_value_that_cannot_be_packed_is_a_protocol_error() -> None:
    hit = PackedHit.model_construct(**REQUIRED, metadata={"bad": object()})
    with pytest.raises(ProtocolError, match="cannot pack Reply"):
        pack_reply(Reply.model_construct(job_id="j", hits=[hit], runs=[]))
