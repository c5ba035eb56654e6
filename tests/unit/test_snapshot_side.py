"""A snapshot's sidecar is packed in chunks (so the GIL is let go between them) into exactly the
bytes one ``msgpack.packb`` of it would give."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.index.projection import Parts, pack_side, unpack_side

WORDS = st.text(alphabet="abcdefgh", min_size=1, max_size=6)
SEQS = st.integers(min_value=0, max_value=2**40)
MAPS = st.one_of(
    st.dictionaries(SEQS, st.text(max_size=8), max_size=40),
    st.dictionaries(SEQS, st.lists(WORDS, max_size=4).map(tuple), max_size=40),
    st.dictionaries(SEQS, st.dictionaries(WORDS, st.integers(1, 5), max_size=4), max_size=40),
)


def whole(side: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb(side, use_bin_type=True))


@settings(max_examples=300, deadline=None)
@given(ids=MAPS, keywords=MAPS, terms=MAPS, chunk=st.integers(1, 12))
def test_a_side_packed_in_chunks_is_the_side_packed_whole(
    ids: dict[int, Any], keywords: dict[int, Any], terms: dict[int, Any], chunk: int
) -> None:
    side = {"format": 3, "ns": "n", "position": "1-0", "ids": ids, "keywords": keywords}
    side["terms"] = terms
    assert pack_side(side, chunk) == whole(side)


def test_a_map_past_map16_keeps_its_header_and_order() -> None:
    big = {seq: (f"w{seq % 7}", "x") for seq in range(70_000, 0, -1)}
    side = {"format": 3, "keywords": big, "empty": {}, "small": {1: "a"}}
    packed = pack_side(side, 10_000)
    assert packed == whole(side)
    assert list(msgpack.unpackb(packed, strict_map_key=False)["keywords"])[:2] == [70_000, 69_999]


PAIRS = st.lists(st.tuples(SEQS, st.text(max_size=8)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ids=MAPS, keywords=st.one_of(MAPS, PAIRS), terms=MAPS, chunk=st.integers(1, 12))
def test_a_side_read_an_entry_at_a_time_is_the_side_unpacked_whole(
    ids: dict[int, Any], keywords: Any, terms: dict[int, Any], chunk: int
) -> None:
    side = {"format": 3, "ns": "n", "position": "1-0", "ids": ids, "keywords": keywords}
    side["terms"], side["none"], side["list"] = terms, None, []
    packed = pack_side(side, chunk)
    assert unpack_side(packed) == msgpack.unpackb(packed, strict_map_key=False, use_list=False)


def test_a_big_map_is_read_as_unpackb_reads_it() -> None:
    side = {"format": 3, "ids": {seq: f"n{seq}" for seq in range(70_000)}, "keywords": {}}
    packed = pack_side(side)
    assert unpack_side(packed) == side


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb({"format": 3, "ids": {1: "a", 2: "b"}})[:-1],  # cut short
        msgpack.packb({"format": 3, "ids": {1: "a"}}) + b"\x01",  # more after it
        msgpack.packb([3, {1: "a"}]),  # not a map
        b"",
    ],
)
def test_a_side_that_is_not_one_whole_map_is_refused(raw: bytes) -> None:
    with pytest.raises((ValueError, msgpack.UnpackException)):
        unpack_side(raw)


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.dictionaries(SEQS, st.text(max_size=8), max_size=20), max_size=6),
    chunk=st.integers(1, 12),
)
def test_a_map_in_parts_is_packed_as_the_map_it_holds(
    parts: list[dict[int, str]], chunk: int
) -> None:
    disjoint: list[dict[int, str]] = []
    seen: set[int] = set()
    for part in parts:
        disjoint.append({k: v for k, v in part.items() if k not in seen})
        seen |= part.keys()
    merged = {k: v for part in disjoint for k, v in part.items()}
    side = {"format": 3, "ids": Parts(disjoint), "keywords": Parts([])}
    assert pack_side(side, chunk) == whole({"format": 3, "ids": merged, "keywords": {}})
    assert Parts(disjoint) == merged and len(Parts(disjoint)) == len(merged)
