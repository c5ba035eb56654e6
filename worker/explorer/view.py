"""Which notes a graph view shows, and what it shows of them, read from Redis.

A selection is one of:

- ``connected`` (the default): the active notes with the most links, up to ``max_nodes`` (ties:
  oldest first);
- ``seed``: a note, then the notes within ``hops`` links of it, nearest first and, within a hop,
  strongest link first;
- ``query``: the search hits for a text (the worker's search path, best first), then their
  neighbours within ``hops`` links.

A node carries the note's fields, its styles (``STYLES``), its link count and its audit history
(the newest ``AUDIT_PER_NOTE`` entries among the newest ``AUDIT_SCAN`` of the namespace); an
edge carries the link's weight, label, reason, provenance and time. Links are undirected: one
edge per linked pair of shown notes, with the metadata stored at the end shown first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from producer import MemoryClient, ProtocolError
from producer.core import walk_step
from producer.protocol import Note, note_from_hash, unpack_link
from worker.connection import Streams
from worker.intake.construction import PART_OF
from worker.organise.linking import SEQUENCE
from worker.readable import iso_time, readable
from worker.store.graph import READ_CHUNK
from worker.store.notes import Fields, read_notes

log = logging.getLogger(__name__)

#: node styles: a note's kind (note | insight | source: split into atoms), then "atom" (split
#: off a source note) and "superseded" (a later note replaced it) where they apply
STYLES = ("note", "insight", "source", "atom", "superseded")
KINDS = frozenset({"note", "insight", "source"})  #: kinds with a style of their own
MAX_HOPS = 5  #: links a seed or query selection follows at most
AUDIT_SCAN = 50_000  #: newest audit entries of the namespace read for the nodes' histories
AUDIT_PER_NOTE = 20  #: audit entries kept per node, newest first
AUDIT_CHUNK = 1_000  #: audit entries read per round trip
LABEL_CHARS = 48  #: characters of a note's content in its node label
#: edge styles, from the link's label and reason: a Folgezettel link to the previous note, a
#: supersession (either way), an insight to a note it abstracts, an atom to its source note, a
#: contradiction, and every other link
EDGE_STYLES = ("sequence", "supersession", "abstraction", "part", "contradiction", "link")


@dataclass(frozen=True)
class Selection:
    """How the shown notes were chosen, and the note ids in the order they were chosen."""

    mode: str  #: connected | seed | query
    ids: list[str]
    max_nodes: int
    seed: str | None = None
    query: str | None = None
    hops: int = 0


@dataclass(frozen=True)
class GraphView:
    """What a page or an export shows: plain-JSON nodes and edges (times as ISO 8601 strings)."""

    namespace: str
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    #: mode, seed, query, hops, max_nodes, active (notes in the namespace), shown, truncated
    selection: dict[str, Any]


def select(
    mem: MemoryClient,
    st: Streams,
    ns: str,
    *,
    seed: str | None = None,
    query: str | None = None,
    hops: int = 0,
    max_nodes: int = 500,
) -> Selection:
    """The notes to show; NotFound for an unknown seed."""
    if seed is not None:
        starts = [mem.get(seed, namespace=ns).id]  # a merged note's survivor
        ids = expand(st, ns, starts, hops, max_nodes)
        return Selection("seed", ids, max_nodes, seed=seed, hops=hops)
    if query is not None:
        k = min(max_nodes, mem.settings.max_k)
        starts = [hit.id for hit in mem.search(query, namespace=ns, k=k)]
        ids = expand(st, ns, starts, hops, max_nodes)
        return Selection("query", ids, max_nodes, query=query, hops=hops)
    return Selection("connected", most_connected(st, ns, max_nodes), max_nodes)


def most_connected(st: Streams, ns: str, max_nodes: int) -> list[str]:
    """Up to ``max_nodes`` active notes, most links first; ties oldest first."""
    ids = [m.decode() for m in st.redis.zrange(st.keys.active(ns), 0, -1)]
    degrees: list[int] = []
    for start in range(0, len(ids), READ_CHUNK):
        pipe = st.redis.pipeline(transaction=False)
        for nid in ids[start : start + READ_CHUNK]:
            pipe.hlen(st.keys.links(ns, nid))
        degrees += pipe.execute()
    order = sorted(range(len(ids)), key=lambda i: -degrees[i])  # stable: seq order on ties
    return [ids[i] for i in order[:max_nodes]]


def expand(st: Streams, ns: str, starts: Sequence[str], hops: int, max_nodes: int) -> list[str]:
    """``starts``, then the notes within ``hops`` links of them breadth first, up to
    ``max_nodes`` in all."""
    found: dict[str, tuple[int, str, float]] = {nid: (0, nid, 1.0) for nid in starts}
    frontier = list(found)
    for hop in range(1, hops + 1):
        if not frontier or len(found) >= max_nodes:
            break
        pipe = st.redis.pipeline(transaction=False)
        for nid in frontier:
            pipe.hgetall(st.keys.links(ns, nid))
        frontier = walk_step(found, "", frontier, pipe.execute(), hop)
    return list(found)[:max_nodes]


def read_view(st: Streams, ns: str, selection: Selection) -> GraphView:
    """The nodes (active notes among the selection) and the edges between them."""
    hashes: dict[str, Fields] = {}
    for start in range(0, len(selection.ids), READ_CHUNK):
        chunk = selection.ids[start : start + READ_CHUNK]
        hashes.update(read_notes(st.redis, st.keys, ns, chunk))
    notes = _decode(hashes, selection.ids)
    links = _read_links(st, ns, list(notes))
    history = read_history(st, ns, set(notes))
    nodes = [
        node_of(note, hashes[nid], len(links[nid]), history.get(nid, []))
        for nid, note in notes.items()
    ]
    active = int(st.redis.zcard(st.keys.active(ns)))
    return GraphView(ns, nodes, edges_of(links), _summary(selection, active, len(nodes)))


def _decode(hashes: Mapping[str, Fields], order: Iterable[str]) -> dict[str, Note]:
    """The active notes among ``hashes``, in ``order``; a hash that is no note is logged."""
    out: dict[str, Note] = {}
    for nid in order:
        raw = hashes.get(nid)
        if raw is None or raw.get(b"status") != b"active":
            continue
        try:
            out[nid] = note_from_hash(raw)
        except ProtocolError as exc:
            log.warning("left out note id=%s: %s", nid, exc)
    return out


def _read_links(st: Streams, ns: str, ids: Sequence[str]) -> dict[str, dict[str, bytes]]:
    """The packed links of each id (neighbour -> packed link)."""
    out: dict[str, dict[str, bytes]] = {}
    for start in range(0, len(ids), READ_CHUNK):
        chunk = ids[start : start + READ_CHUNK]
        pipe = st.redis.pipeline(transaction=False)
        for nid in chunk:
            pipe.hgetall(st.keys.links(ns, nid))
        for nid, row in zip(chunk, pipe.execute(), strict=True):
            out[nid] = {nb.decode(): raw for nb, raw in row.items()}
    return out


def edges_of(links: Mapping[str, Mapping[str, bytes]]) -> list[dict[str, Any]]:
    """One edge per linked pair of ``links``' notes (both ends shown; no self links), with the
    metadata stored at the end that comes first."""
    edges: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for nid, row in links.items():
        for nb, raw in row.items():
            if nb == nid or nb not in links or (nb, nid) in seen:
                continue
            seen.add((nid, nb))
            weight, meta = unpack_link(raw)
            at = meta.get("at")
            edge: dict[str, Any] = {
                "id": f"e{len(edges)}",
                "source": nid,
                "target": nb,
                "weight": weight if math.isfinite(weight) else 0.0,
                "label": str(meta.get("label") or "related"),
                "reason": str(meta.get("reason", "")),
                "provenance": str(meta.get("source", "")),
                "at": _time(at) if isinstance(at, float | int) else None,
            }
            edge["style"] = edge_style(edge["label"], edge["reason"])
            edges.append(edge)
    return edges


def edge_style(label: str, reason: str) -> str:
    """The edge style of a link (see ``EDGE_STYLES``)."""
    if SEQUENCE in (label, reason):
        return "sequence"
    if reason in ("supersedes", "superseded_by"):
        return "supersession"
    if reason == "abstracted_from":
        return "abstraction"
    if reason == PART_OF:
        return "part"
    return "contradiction" if label == "contradicts" else "link"


def styles_of(note: Note) -> list[str]:
    """The node styles of a note (see ``STYLES``)."""
    out = [note.kind if note.kind in KINDS else "note"]
    if PART_OF in note.metadata:
        out.append("atom")
    if note.superseded_by is not None or note.valid_to is not None:
        out.append("superseded")
    return out


def node_of(note: Note, raw: Fields, degree: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    """A node: the note's fields, label, styles, link count and audit history, as plain JSON
    (times as ISO 8601, or None for none and for times no date can show)."""
    part_of = note.metadata.get(PART_OF)
    return {
        "id": note.id,
        "label": _label(note.content),
        "kind": note.kind,
        "styles": styles_of(note),
        "content": note.content,
        "tags": note.tags,
        "keywords": note.keywords,
        "context": note.context,
        "metadata": readable(note.metadata),
        "agent": note.agent,
        "created_at": _time(note.created_at),
        "updated_at": _time(_number(raw.get(b"updated_at"))),
        "event_time": _time(note.event_time),
        "valid_to": _time(note.valid_to),
        "last_access": _time(note.last_access),
        "importance": note.importance if math.isfinite(note.importance) else None,
        "access_count": note.access_count,
        "version": note.version,
        "embedder": note.embedder,
        "superseded_by": note.superseded_by,
        "part_of": part_of if isinstance(part_of, str) else None,
        "merged_from": note.merged_from,
        "degree": degree,
        "audit": history,
    }


def _time(value: float | None) -> str | None:
    if value is None or not value > 0:  # none, 0 (never) or NaN
        return None
    try:
        return iso_time(value)
    except (OverflowError, ValueError, OSError):
        return None


def _label(content: str) -> str:
    text = " ".join(content.split())
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "\u2026"


def _number(raw: bytes | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def read_history(st: Streams, ns: str, ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The audit entries of ``ids``, newest first: at most AUDIT_PER_NOTE per note, among the
    namespace's newest AUDIT_SCAN entries."""
    out: dict[str, list[dict[str, Any]]] = {}
    high, scanned = "+", 0
    while scanned < AUDIT_SCAN:
        rows = st.redis.xrevrange(st.keys.audit(ns), max=high, count=AUDIT_CHUNK)
        for _, entry in rows:
            nid = entry.get(b"id", b"").decode("utf-8", "replace")
            if nid in ids and len(out.setdefault(nid, [])) < AUDIT_PER_NOTE:
                out[nid].append(audit_entry(entry))
        scanned += len(rows)
        if len(rows) < AUDIT_CHUNK:
            break
        high = f"({rows[-1][0].decode()}"
    return out


def audit_entry(entry: Mapping[bytes, bytes]) -> dict[str, Any]:
    """One audit entry as shown: when, op, actor, source and the fields it changed."""

    def text(name: bytes) -> str:
        return entry.get(name, b"").decode("utf-8", "replace")

    return {
        "at": _time(_number(entry.get(b"ts"))),
        "op": text(b"op"),
        "actor": text(b"actor"),
        "source": text(b"source"),
        "fields": changed_fields(_unpacked(entry.get(b"before")), _unpacked(entry.get(b"after"))),
    }


def _unpacked(raw: bytes | None) -> object:
    try:
        return msgpack.unpackb(raw, raw=False) if raw else None
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def changed_fields(before: object, after: object) -> list[str]:
    """The names of the fields an audit entry's ``after`` sets to a new value."""
    if not isinstance(after, dict):
        return []
    old = before if isinstance(before, dict) else {}
    return sorted(str(k) for k, value in after.items() if k not in old or old[k] != value)


def _summary(selection: Selection, active: int, shown: int) -> dict[str, Any]:
    return {
        "mode": selection.mode,
        "seed": selection.seed,
        "query": selection.query,
        "hops": selection.hops,
        "max_nodes": selection.max_nodes,
        "active": active,
        "shown": shown,
        "truncated": shown < active and len(selection.ids) >= selection.max_nodes,
        "generated_at": iso_time(time.time()),
    }
