"""Redis persistence of notes, links, the change log and the audit stream (the canonical data).

Every write here goes into a MULTI/EXEC pipeline that the caller executes, so a batch of notes,
their links on both sides, their change-log entries and their audit entries commit atomically.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis import Redis
from redis.client import Pipeline

from producer.keys import Keys
from producer.protocol import PACKED_FIELDS
from worker.linking import Link

Fields = dict[bytes, bytes]  #: a note hash as HGETALL returns it


@dataclass
class NoteWrite:
    """A note to create or update: every field of its hash, unpacked."""

    id: str
    seq: int
    fields: dict[str, Any]
    vec: bytes
    created: bool  #: False when it updates an existing note
    before: dict[str, Any] | None = None  #: audit "before" for updates


@dataclass
class Changes:
    """What one commit does to a namespace; applied to the projection after EXEC."""

    added: list[tuple[int, str]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)


def encode_fields(fields: Mapping[str, Any]) -> dict[str, bytes | str | int | float]:
    """Hash field values: msgpack for the structured fields, plain for the rest."""
    out: dict[str, bytes | str | int | float] = {}
    for key, value in fields.items():
        if key in PACKED_FIELDS:
            out[key] = msgpack.packb(value, use_bin_type=True)
        elif value is not None:
            out[key] = value
    return out


def decode_field(key: str, raw: bytes) -> Any:
    return msgpack.unpackb(raw) if key in PACKED_FIELDS else raw.decode()


def read_notes(r: Redis, keys: Keys, ns: str, ids: Sequence[str]) -> dict[str, Fields]:
    """HGETALL of each id that exists (one round trip)."""
    pipe = r.pipeline(transaction=False)
    for nid in ids:
        pipe.hgetall(keys.note(ns, nid))
    return {nid: f for nid, f in zip(ids, pipe.execute(), strict=True) if f}


def read_links(r: Redis, keys: Keys, ns: str, ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """Neighbour -> weight of each id (one round trip)."""
    pipe = r.pipeline(transaction=False)
    for nid in ids:
        pipe.zrange(keys.links(ns, nid), 0, -1, withscores=True)
    rows = pipe.execute()
    return {nid: {m.decode(): float(w) for m, w in row} for nid, row in zip(ids, rows, strict=True)}


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
    entry = {
        "ts": repr(time.time()),
        "op": op,
        "id": note_id,
        "actor": actor,
        "source": source,
        "before": msgpack.packb(before, use_bin_type=True),
        "after": msgpack.packb(after, use_bin_type=True),
    }
    pipe.xadd(keys.audit(ns), entry)


def write_note(pipe: Pipeline, keys: Keys, ns: str, note: NoteWrite, changelog_max: int) -> None:
    pipe.hset(keys.note(ns, note.id), mapping={**encode_fields(note.fields), "vec": note.vec})
    pipe.zadd(keys.active(ns), {note.id: note.seq})
    pipe.zrem(keys.tombstoned(ns), note.id)
    pipe.hset(keys.seqs(ns), str(note.seq), note.id)
    pipe.xadd(
        keys.changes(ns),
        {"op": "add", "seq": note.seq, "id": note.id},
        maxlen=changelog_max,
        approximate=True,
    )


def write_links(
    pipe: Pipeline, keys: Keys, ns: str, links: Iterable[Link], source: str, actor: str
) -> int:
    """Both directions of each link, with reason and provenance; one audit entry per link."""
    count = 0
    now = time.time()
    for link in links:
        meta = msgpack.packb({"reason": link.reason, "source": source, "at": now})
        for a, b in ((link.a, link.b), (link.b, link.a)):
            pipe.zadd(keys.links(ns, a), {b: link.weight})
            pipe.hset(keys.linkmeta(ns, a), b, meta)
        audit(
            pipe,
            keys,
            ns,
            "link",
            link.a,
            actor=actor,
            source=source,
            after={"to": link.b, "weight": link.weight, "reason": link.reason},
        )
        count += 1
    return count


def unlink_all(pipe: Pipeline, keys: Keys, ns: str, note_id: str, neighbours: Iterable[str]) -> int:
    """Remove every link of ``note_id`` from both sides; return how many were removed."""
    count = 0
    for nb in neighbours:
        pipe.zrem(keys.links(ns, nb), note_id)
        pipe.hdel(keys.linkmeta(ns, nb), note_id)
        count += 1
    pipe.delete(keys.links(ns, note_id), keys.linkmeta(ns, note_id))
    return count


def tombstone(
    pipe: Pipeline, keys: Keys, ns: str, note_id: str, seq: int, changelog_max: int
) -> None:
    """Mark a note tombstoned, drop its vector and take it out of the active set."""
    now = time.time()
    pipe.hset(keys.note(ns, note_id), mapping={"status": "tombstoned", "updated_at": now})
    pipe.hdel(keys.note(ns, note_id), "vec")
    pipe.zrem(keys.active(ns), note_id)
    pipe.zadd(keys.tombstoned(ns), {note_id: now})
    pipe.xadd(
        keys.changes(ns),
        {"op": "remove", "seq": seq, "id": note_id},
        maxlen=changelog_max,
        approximate=True,
    )


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
    """A note hash with its values decoded (vector and bookkeeping left out)."""
    out: dict[str, Any] = {}
    for k, value in raw.items():
        key = k.decode()
        if key not in ("vec", "src"):
            out[key] = decode_field(key, value)
    return out


def stream_pos(entry_id: str | bytes) -> tuple[int, int]:
    """A Redis stream entry id as a comparable (milliseconds, sequence) pair."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)
