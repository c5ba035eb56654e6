"""A namespace's change log (``Keys.changes``): the stream of adds and removes, by (seq, id),
that projections replay to catch up with the canonical notes without reading them all. The
store writes an entry in the same transaction as each change; projections read them in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgpack
from redis.client import Pipeline

from producer.keys import Keys


def log_change(
    pipe: Pipeline, keys: Keys, ns: str, op: str, items: Sequence[tuple[int, str]], cap: int
) -> None:
    """One change-log entry: ``op`` (add | remove) applied to (seq, id) pairs."""
    packed = msgpack.packb([list(item) for item in items], use_bin_type=True)
    pipe.xadd(keys.changes(ns), {"op": op, "items": packed}, maxlen=cap, approximate=True)


def read_change(fields: Mapping[bytes, bytes]) -> tuple[str, list[tuple[int, str]]]:
    """Decode a change-log entry written by log_change."""
    items = msgpack.unpackb(fields[b"items"], raw=False)
    return fields[b"op"].decode(), [(int(seq), str(nid)) for seq, nid in items]


def stream_pos(entry_id: str | bytes) -> tuple[int, int]:
    """A Redis stream entry id as a comparable (milliseconds, sequence) pair."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)
