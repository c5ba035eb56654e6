"""Redis persistence of notes, links, the change log and the audit stream (the canonical data).

Every write here goes into a MULTI/EXEC pipeline that the caller executes, so a batch of notes,
their links on both sides, their change-log entries and their audit entries commit atomically.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
from redis import Redis
from redis.client import Pipeline

from producer.keys import Keys
from producer.protocol import PACKED_FIELDS, link_packer, link_weights
from worker.bulk import BulkPipeline, fields
from worker.index.changelog import log_change, stream_pos

Fields = dict[bytes, bytes]  #: a note hash as HGETALL returns it
#: Fields only a tombstone has: writing the note again (a re-store) drops them, so a merged id
#: stored again is a note of its own, and deleting it later leaves no pointer to the survivor.
TOMBSTONE_FIELDS = ("merged_into",)
#: Fields a note hash leaves out while they hold these values, the Note model's defaults (about
#: 70 bytes less for a note without an agent, an event time or metadata, never retrieved yet);
#: left_out and producer.protocol.note_from_hash fill them back in, and every other reader reads
#: a missing one as its default. Hashes that hold them read the same.
DEFAULT_FIELDS: dict[str, Any] = {
    "agent": None,
    "event_time": None,
    "metadata": {},
    "access_count": 0,
    "last_access": 0.0,
}
COUNTERS = ("access_count", "last_access")  #: the DEFAULT_FIELDS that erasing a note keeps


class Link(NamedTuple):
    """A proposed undirected link ``a`` - ``b``; an empty ``source`` is the writer's default."""

    a: str
    b: str
    weight: float
    reason: str
    label: str = "related"
    source: str = ""


@dataclass
class NoteWrite:
    """A note to create or update: every field of its hash, unpacked."""

    id: str
    seq: int
    fields: dict[str, Any]
    vec: bytes
    created: bool  #: False when it updates an existing note
    before: dict[str, Any] | None = None  #: audit "before" for updates


def encode_fields(fields: Mapping[str, Any]) -> dict[str, bytes | str | int | float]:
    """Hash field values: msgpack for the structured fields, plain for the rest."""
    out: dict[str, bytes | str | int | float] = {}
    for key, value in fields.items():
        if key in PACKED_FIELDS:
            out[key] = msgpack.packb(value, use_bin_type=True)
        elif value is not None:
            out[key] = value
    return out


def encode_note(fields: Mapping[str, Any]) -> dict[str, bytes | str | int | float]:
    """``encode_fields`` of a whole note, without the DEFAULT_FIELDS that hold their default."""
    return encode_fields(
        {k: v for k, v in fields.items() if k not in DEFAULT_FIELDS or v != DEFAULT_FIELDS[k]}
    )


def decode_field(key: str, raw: bytes) -> Any:
    return msgpack.unpackb(raw) if key in PACKED_FIELDS else raw.decode()


def decode_fields(names: Sequence[str], raw: Sequence[bytes | None]) -> dict[str, Any]:
    """The fields an HMGET of ``names`` returned, decoded; fields the note lacks are left out."""
    out: dict[str, Any] = {}
    for name, value in zip(names, raw, strict=True):
        if value is not None:
            out[name] = msgpack.unpackb(value) if name in PACKED_FIELDS else value.decode()
    return out


def read_notes(r: Redis, keys: Keys, ns: str, ids: Sequence[str]) -> dict[str, Fields]:
    """HGETALL of each id that exists (one round trip)."""
    pipe = BulkPipeline(r)
    decode = queue_notes(pipe, keys, ns, ids)
    return decode(pipe.execute())


def queue_notes(
    pipe: BulkPipeline, keys: Keys, ns: str, ids: Sequence[str]
) -> Callable[[list[Any]], dict[str, Fields]]:
    """Queue HGETALL of each id; the decoder returns the hashes of those that exist."""
    start = len(pipe)
    for nid in ids:
        pipe.queue("HGETALL", keys.note(ns, nid))

    def decode(replies: list[Any]) -> dict[str, Fields]:
        rows = replies[start : start + len(ids)]
        return {nid: fields(raw) for nid, raw in zip(ids, rows, strict=True) if raw}

    return decode


def read_links(r: Redis, keys: Keys, ns: str, ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """Neighbour -> weight of each id, in one round trip."""
    pipe = BulkPipeline(r)
    for nid in ids:
        pipe.queue("HGETALL", keys.links(ns, nid))
    return {nid: link_weights(row) for nid, row in zip(ids, pipe.execute(), strict=True)}


def audit(
    pipe: Pipeline,
    keys: Keys,
    ns: str,
    op: str,
    note_id: str,
    *,
    actor: str,
    source: str,
    before: Any = None,
    after: Any = None,
) -> None:
    """Append one audit entry: who (actor), what (op, id), when, before/after, source."""
    pipe.execute_command(
        "XADD",
        keys.audit(ns),
        "*",
        "ts",
        repr(time.time()),
        "op",
        op,
        "id",
        note_id,
        "actor",
        actor,
        "source",
        source,
        "before",
        msgpack.packb(before, use_bin_type=True),
        "after",
        msgpack.packb(after, use_bin_type=True),
    )


def changed(pipe: Pipeline, keys: Keys, ns: str) -> None:
    """Queue the INCR of the namespace's version in a transaction that changes what a search
    reads of its notes (fields, links, which notes are active; access times excepted): search
    processes drop what they kept of the namespace (worker/index/rows.py)."""
    pipe.execute_command("INCR", keys.version(ns))


def write_notes(pipe: Pipeline, keys: Keys, ns: str, writes: Sequence[NoteWrite], cap: int) -> None:
    """The note hashes (without the TOMBSTONE_FIELDS of an earlier life, nor DEFAULT_FIELDS at
    their default), the active set and one change-log entry for all of them."""
    for note in writes:
        encoded = encode_note(note.fields)
        args = [x for pair in encoded.items() for x in pair]
        pipe.execute_command("HSET", keys.note(ns, note.id), *args, "vec", note.vec)
        if not note.created:
            left_out = [k for k in DEFAULT_FIELDS if k in note.fields and k not in encoded]
            pipe.execute_command("HDEL", keys.note(ns, note.id), *TOMBSTONE_FIELDS, *left_out)
    pipe.execute_command("ZADD", keys.active(ns), *[x for n in writes for x in (n.seq, n.id)])
    pipe.execute_command("ZREM", keys.tombstoned(ns), *[n.id for n in writes])
    log_change(pipe, keys, ns, "add", [(n.seq, n.id) for n in writes], cap)


def undirected(removed: set[str], neighbours: dict[str, dict[str, float]]) -> int:
    """Links removed, counting a link between two removed notes once."""
    total = 0
    for nid, nbs in neighbours.items():
        total += sum(1 for nb in nbs if nb not in removed or nb > nid)
    return total


def write_links(pipe: Pipeline, keys: Keys, ns: str, links: Iterable[Link], source: str) -> int:
    """Both directions of each link with its weight, reason, label and provenance (the link's
    own source, else ``source``): one HSET per note touched. Returns how many were written."""
    now = time.time()
    packers = {source: link_packer(source, now)}
    args: dict[str, list[Any]] = {}  # note -> HSET arguments (neighbour, packed link, ...)
    count = 0
    for a, b, weight, reason, label, own in links:
        pack = packers.get(own or source)
        if pack is None:
            pack = packers[own] = link_packer(own, now)
        packed = pack(weight, reason, label)
        for x, y in ((a, b), (b, a)):
            if x in args:
                args[x] += (y, packed)
            else:
                args[x] = [y, packed]
        count += 1
    for nid, fields_ in args.items():
        pipe.execute_command("HSET", keys.links(ns, nid), *fields_)
    return count


def unlink_all(pipe: Pipeline, keys: Keys, ns: str, note_id: str, neighbours: Iterable[str]) -> int:
    """Remove every link of ``note_id`` from both sides; return how many were removed."""
    count = 0
    for nb in neighbours:
        pipe.execute_command("HDEL", keys.links(ns, nb), note_id)
        count += 1
    pipe.execute_command("DEL", keys.links(ns, note_id))
    return count


def unlink_pairs(pipe: Pipeline, keys: Keys, ns: str, pairs: Iterable[tuple[str, str]]) -> None:
    """Remove single links ``a`` - ``b`` from both sides."""
    for a, b in pairs:
        pipe.execute_command("HDEL", keys.links(ns, a), b)
        pipe.execute_command("HDEL", keys.links(ns, b), a)


def tombstone_all(
    pipe: Pipeline, keys: Keys, ns: str, seqs: Mapping[str, int], changelog_max: int
) -> None:
    """Mark notes tombstoned, drop their vectors and the tags reviewers refused for them, and
    take them out of the active set."""
    now = time.time()
    for note_id in seqs:
        pipe.hset(keys.note(ns, note_id), mapping={"status": "tombstoned", "updated_at": now})
        pipe.hdel(keys.note(ns, note_id), "vec")
    pipe.hdel(keys.refused(ns), *seqs)
    pipe.zrem(keys.active(ns), *seqs)
    pipe.zadd(keys.tombstoned(ns), dict.fromkeys(seqs, now))
    log_change(pipe, keys, ns, "remove", [(s, n) for n, s in seqs.items()], changelog_max)


def public_view(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The audit-worthy part of a note (no vector, no bookkeeping)."""
    keep = (
        "content",
        "keywords",
        "tags",
        "context",
        "metadata",
        "agent",
        "event_time",
        "importance",
        "status",
        "version",
    )
    return {k: fields[k] for k in keep if k in fields}


def unpack_fields(raw: Fields) -> dict[str, Any]:
    """A note hash with its values decoded (vector and bookkeeping left out), and the
    DEFAULT_FIELDS it leaves out filled in (``left_out``)."""
    out: dict[str, Any] = {}
    for k, value in raw.items():
        key = k.decode()
        if key not in ("vec", "src"):
            out[key] = decode_field(key, value)
    for key, default in left_out(raw).items():
        out[key] = default if key in PACKED_FIELDS else str(default)
    return out


def left_out(raw: Fields) -> dict[str, Any]:
    """The DEFAULT_FIELDS a note hash leaves out, at their defaults: none for a delete's fence,
    only COUNTERS for a note whose content was erased (worker/store/tombstone.py)."""
    if b"seq" not in raw:
        return {}
    whole = b"content" in raw
    return {
        key: copy.copy(default)
        for key, default in DEFAULT_FIELDS.items()
        if key.encode() not in raw and (whole or key in COUNTERS)
    }


def tail_among(r: Redis, keys: Keys, ns: str, ids: Iterable[str]) -> bool:
    """Whether the namespace's sequence tail (its last new note, which the next new note links
    to) is one of ``ids``; a commit that tombstones it deletes the tail with it."""
    raw = r.get(keys.tail(ns))
    return raw is not None and str(msgpack.unpackb(raw, raw=False)[0]) in set(ids)


def reflects(fields: Fields | None, entry_id: str) -> bool:
    """Whether a note hash already reflects inbox entry ``entry_id`` or a later one: the entry
    it records (``src``: the last store or delete applied to the id) is not older. A job it
    reflects is a no-op, so a redelivered, reclaimed or retried job never undoes a later one."""
    src = fields.get(b"src") if fields else None
    return src is not None and stream_pos(src) >= stream_pos(entry_id)


def is_note(fields: Fields | None) -> bool:
    """Whether a hash is a note (active or tombstoned), not only the fence a delete of an id
    that never was a note leaves (``fence_deleted``)."""
    return fields is not None and b"seq" in fields


def fence_deleted(pipe: Pipeline, keys: Keys, ns: str, fences: Mapping[str, str]) -> None:
    """Record on each deleted id the delete's inbox entry (``src``), so that an older job of
    that id is no longer applied. An id with no hash gets one holding only id, status and
    src: deleted before it was ever stored (or before its store was retried)."""
    for note_id, entry_id in fences.items():
        pipe.hset(
            keys.note(ns, note_id),
            mapping={"id": note_id, "status": "tombstoned", "src": entry_id},
        )
