"""Export a namespace as JSONL (format v1, docs/transfer.md): a header line, then one line per
note in seq order (active notes and merged tombstones) with every field and its links, both
ends of each. Reads Redis only; ``zettelq import`` (worker/transfer/importer.py) reads it back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

import msgpack
from redis import Redis

from producer.keys import Keys
from producer.protocol import unpack_link
from worker import vectors
from worker.bulk import BulkPipeline, fields
from worker.store import notes

FORMAT_VERSION = 1  #: the ``zettelq_export`` value of the header line this code writes and reads
READ_CHUNK = 1_000  #: notes read per round trip by export
#: note hash fields an export leaves out: the namespace's own (seq, namespace, the embedder
#: and vector: the target embeds again) and the inbox bookkeeping
LOCAL_FIELDS = frozenset({"seq", "namespace", "embedder", "vec", "src"})
#: the order of a note line's fields (docs/transfer.md); any other field comes after them
FIELD_ORDER = {
    name: i
    for i, name in enumerate(
        (
            "id",
            "content",
            "kind",
            "keywords",
            "tags",
            "context",
            "metadata",
            "agent",
            "created_at",
            "updated_at",
            "event_time",
            "valid_to",
            "superseded_by",
            "importance",
            "importance_auto",
            "importance_prior",
            "access_count",
            "last_access",
            "status",
            "version",
            "merged_from",
            "merged_into",
            "cluster",
            "links",
        )
    )
}
#: plain note hash fields that hold numbers (Redis keeps them as text)
NUMBERS: dict[str, type[float] | type[int]] = {
    "created_at": float,
    "updated_at": float,
    "last_access": float,
    "importance": float,
    "importance_auto": float,
    "importance_prior": float,
    "access_count": int,
    "version": int,
}


def export_lines(r: Redis, keys: Keys, ns: str) -> Iterator[dict[str, Any]]:
    """The header, then every active note and merged tombstone of ``ns`` in seq order."""
    ids = _export_ids(r, keys, ns)
    clusters = {k.decode(): _members(x) for k, x in r.hgetall(keys.clusters(ns)).items()}
    chunks = (ids[i : i + READ_CHUNK] for i in range(0, len(ids), READ_CHUNK))
    records = (rec for chunk in chunks for rec in _read_chunk(r, keys, ns, chunk, set(ids)))
    first = next(records, None)
    yield header(ns, len(ids), first)
    for rec in [first] if first else []:
        yield _finish(rec, clusters)
    for rec in records:
        yield _finish(rec, clusters)


def header(ns: str, count: int, first: Mapping[str, Any] | None) -> dict[str, Any]:
    raw = (first or {}).get("_raw", {})
    return {
        "zettelq_export": FORMAT_VERSION,
        "namespace": ns,
        "exported_at": time.time(),
        "count": count,
        "embedder": raw.get(b"embedder", b"").decode(),
        "dims": vectors.dims(raw.get(b"vec", b"")),
    }


def _members(raw: bytes) -> list[str]:
    return [str(x) for x in msgpack.unpackb(raw, raw=False)]


def _export_ids(r: Redis, keys: Keys, ns: str) -> list[str]:
    """Active notes and merged tombstones, by seq."""
    by_seq = [
        (int(seq), m.decode()) for m, seq in r.zrange(keys.active(ns), 0, -1, withscores=True)
    ]
    dead = [m.decode() for m in r.zrange(keys.tombstoned(ns), 0, -1)]
    pipe = BulkPipeline(r)
    for nid in dead:
        pipe.queue("HMGET", keys.note(ns, nid), "seq", "merged_into")
    for nid, (seq, into) in zip(dead, pipe.execute() if dead else [], strict=True):
        if seq is not None and into is not None:
            by_seq.append((int(seq), nid))
    return [nid for _, nid in sorted(by_seq)]


def _read_chunk(
    r: Redis, keys: Keys, ns: str, ids: Sequence[str], exported: set[str]
) -> Iterator[dict[str, Any]]:
    pipe = BulkPipeline(r)
    decode = notes.queue_notes(pipe, keys, ns, ids)
    for nid in ids:
        pipe.queue("HGETALL", keys.links(ns, nid))
    replies = pipe.execute()
    hashes = decode(replies)
    links = {nid: fields(raw) for nid, raw in zip(ids, replies[len(ids) :], strict=True)}
    kept = {
        nid: {nb.decode(): raw for nb, raw in row.items() if nb.decode() in exported}
        for nid, row in links.items()
    }
    backs = _read_backs(r, keys, ns, kept)
    for nid in ids:
        if nid in hashes:
            yield _record(nid, hashes[nid], kept[nid], backs)


def _read_backs(
    r: Redis, keys: Keys, ns: str, links: Mapping[str, Mapping[str, bytes]]
) -> dict[tuple[str, str], bytes]:
    """The far end of every link: (note, neighbour) -> the neighbour's packed end."""
    pairs = [(nid, nb) for nid, row in links.items() for nb in row]
    if not pairs:
        return {}
    pipe = BulkPipeline(r)
    for nid, nb in pairs:
        pipe.queue("HGET", keys.links(ns, nb), nid)
    return {pair: raw for pair, raw in zip(pairs, pipe.execute(), strict=True) if raw}


def _record(
    nid: str,
    raw: notes.Fields,
    links: Mapping[str, bytes],
    backs: Mapping[tuple[str, str], bytes],
) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    for k, x in raw.items():
        key = k.decode()
        if key not in LOCAL_FIELDS:
            value = notes.decode_field(key, x)
            rec[key] = NUMBERS[key](value) if key in NUMBERS and value is not None else value
    rec.update(notes.left_out(raw))  # a note hash leaves these out, a line names them
    rec["links"] = [_link(nb, links[nb], backs.get((nid, nb))) for nb in sorted(links)]
    rec["_raw"] = raw
    return rec


def _link(target: str, packed: bytes, back: bytes | None) -> dict[str, Any]:
    weight, meta = unpack_link(packed)
    out: dict[str, Any] = {**meta, "target": target, "weight": weight}
    if back is not None and unpack_link(back) != (weight, meta):
        back_weight, back_meta = unpack_link(back)
        out["back"] = {**back_meta, "weight": back_weight}
    return out


def _finish(rec: dict[str, Any], clusters: Mapping[str, list[str]]) -> dict[str, Any]:
    """A note record as its export line: None values left out, an insight's cluster added."""
    rec.pop("_raw", None)
    if rec["id"] in clusters:
        rec["cluster"] = clusters[rec["id"]]
    order = sorted(rec, key=lambda k: (FIELD_ORDER.get(k, len(FIELD_ORDER)), k))
    return {k: rec[k] for k in order if rec[k] is not None}


def write_export(r: Redis, keys: Keys, ns: str, out: TextIO) -> int:
    """Write the export of ``ns`` to ``out``; returns the notes written."""
    count = -1
    for line in export_lines(r, keys, ns):
        out.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n")
        count += 1
    return count
