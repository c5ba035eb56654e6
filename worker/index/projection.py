"""A worker's per-namespace projection of Redis: the FAISS index, the BM25 index and the
seq -> id map.

Redis is the truth (docs/architecture.md). A projection is built from the namespace's notes, or
loaded from a snapshot, then kept current by replaying the namespace's change log. Any
projection can be thrown away: the next use rebuilds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgpack
import numpy as np
from redis import Redis

from producer.keys import Keys
from worker import vectors
from worker.bulk import BulkPipeline
from worker.errors import IndexCorrupt
from worker.index.changelog import read_change, stream_pos
from worker.index.lexical import LexicalIndex, analyze
from worker.index.rows import RowCache
from worker.index.vector import VectorIndex
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 3  #: bumped when the sidecar changes; older snapshots are rebuilt
#: sidecar formats this code reads: 2 held (seq, value) pairs where 3 holds maps
READ_FORMATS = frozenset({2, SNAPSHOT_FORMAT})
CATCH_UP_CHUNK = 2_000  #: change-log entries read per round trip
REBUILD_CHUNK = 1_000  #: notes fetched per round trip when rebuilding
PACK_CHUNK = 10_000  #: map entries a snapshot's sidecar packs per call (pack_side)
MAPS_CHUNK = 10_000  #: notes whose map entries a snapshot copies per hold of the lock
SIDE_READ_SIZE = 1 << 20  #: bytes of a sidecar ``unpack_side`` reads at a time
#: msgpack's first bytes of a map (fixmap, map 16, map 32) and of an array
MSGPACK_MAPS = frozenset({*range(0x80, 0x90), 0xDE, 0xDF})
MSGPACK_ARRAYS = frozenset({*range(0x90, 0xA0), 0xDC, 0xDD})
#: one ``settle_soon`` rebuild at a time per process: each holds a copy of its namespace's
#: vectors and a second index while it builds, so namespaces due together take turns
_REBUILD_TURN = threading.Lock()

#: (position, change-log entries after it) as XRANGE returned them
Prefetched = tuple[str, list[tuple[bytes, dict[bytes, bytes]]]]


class Named(Protocol):
    """What a projection needs of the embedder: the name its vectors carry, and their width."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...


class Source(Protocol):
    """Where a projection comes from: the data Redis, its keys, the settings and the embedder's
    name and width (a WorkerContext is one; nothing in index/ knows the context)."""

    @property
    def redis(self) -> Redis: ...

    @property
    def keys(self) -> Keys: ...

    @property
    def settings(self) -> WorkerSettings: ...

    @property
    def embedder(self) -> Named: ...


class Projection:
    """The index of one namespace. Callers hold ``lock`` while reading or changing it."""

    def __init__(self, ns: str, index: VectorIndex, lexical: LexicalIndex) -> None:
        self.ns = ns
        self.index = index
        self.ids: dict[int, str] = {}
        #: seq -> the note's keywords, as a tuple: tuples of strings are not tracked by the
        #: garbage collector (frozensets were, one per note: a full collection walked them all,
        #: 0.14 s at 200k notes against 0.05 s)
        self.keywords: dict[int, tuple[str, ...]] = {}
        self.lexical = lexical
        self.position = "0-0"  #: last change-log entry applied
        #: whether the last search found nothing to catch up (the next one then draws its
        #: candidates before reading the change log, in the same round trip)
        self.settled = False
        self.lock = threading.RLock()
        self.rows = RowCache()  #: what searches read of these notes (worker/index/rows.py)
        self._rebuilder: threading.Thread | None = None  #: the last ``settle_soon`` thread
        #: for each copy of the maps being taken (``freeze``), the seqs changed since it began
        self._changed: list[set[int]] = []

    def add(
        self,
        seqs: list[int],
        ids: list[str],
        vecs: np.ndarray,
        keywords: Sequence[Collection[str]],
        terms: list[list[str]],
        *,
        rebuild: bool = False,
    ) -> None:
        """Index notes; ``terms`` are each note's BM25 terms (``lexical.analyze`` of its
        content). A vector index rebuild this makes due is left to ``settle`` unless
        ``rebuild``."""
        if not seqs:
            return
        self.index.add(
            np.asarray(seqs, dtype=np.int64),
            np.ascontiguousarray(vecs, np.float32),
            rebuild=rebuild,
        )
        for seq, nid, kws, words in zip(seqs, ids, keywords, terms, strict=True):
            self.ids[seq] = nid
            self.keywords[seq] = tuple(kws)
            self.lexical.add(seq, words)
        for changed in self._changed:
            changed.update(seqs)

    def remove(self, seqs: list[int]) -> None:
        if not seqs:
            return
        self.index.remove(np.asarray(seqs, dtype=np.int64), rebuild=False)
        for seq in seqs:
            self.ids.pop(seq, None)
            self.keywords.pop(seq, None)
            self.lexical.remove(seq)
        for changed in self._changed:
            changed.update(seqs)

    @contextmanager
    def copying_maps(self) -> Iterator[MapsCopy]:
        """A copy of the id, keyword and term-count maps taken apart (``MapsCopy``); call without
        ``lock`` held."""
        copy = MapsCopy(self)
        try:
            yield copy
        finally:
            with self.lock:
                self._changed = [c for c in self._changed if c is not copy.changed]

    def settle(self) -> None:
        """Rebuild the vector index if it is due (an IVF index grown or shrunk ``IVF_REGROW``
        times since it was trained: 1.2 s at 83k notes, seconds more past that), holding
        ``lock`` only to start and to finish: searches and changes go on meanwhile with the
        index as it was, and the changes made meanwhile are applied to the new one. Call it
        without ``lock`` held (with it, the rebuild holds it throughout)."""
        with self.lock:
            index = self.index
            if not index.rebuild_due():
                return
            plan = index.begin_rebuild(self.lock)
        built = None
        try:
            built = plan.build()
        finally:
            with self.lock:
                index.end_rebuild(built, plan.replayed)

    def settle_soon(self) -> None:
        """``settle`` in a thread of its own when a rebuild is due and none is running (for a
        search or a drain, which must not wait for one), once no other namespace of this
        process is rebuilding; ``wait_settled`` waits for it."""
        with self.lock:
            if not self.index.rebuild_due() or self.rebuilding():
                return
            name = f"zq-rebuild-{self.ns}"
            self._rebuilder = threading.Thread(target=self._settle_logged, name=name, daemon=True)
            self._rebuilder.start()

    def rebuilding(self) -> bool:
        """Whether a ``settle_soon`` thread is still running."""
        return self._rebuilder is not None and self._rebuilder.is_alive()

    def wait_settled(self, timeout_s: float | None = None) -> bool:
        """Wait for the rebuild ``settle_soon`` started, if any; False if it still runs after
        ``timeout_s``. Call it without ``lock`` held (the rebuild takes it to finish)."""
        rebuilder = self._rebuilder
        if rebuilder is not None:
            rebuilder.join(timeout_s)
        return not self.rebuilding()

    def _settle_logged(self) -> None:
        try:
            with _REBUILD_TURN:
                self.settle()
        except Exception:  # the old index serves on, and the next catch-up tries again
            log.exception("rebuilding the vector index of ns=%s failed", self.ns)


class Parts(Mapping[int, Any]):
    """A map held as dicts with disjoint keys: a snapshot's copy of one of a projection's maps,
    made a chunk at a time (``MapsCopy``), so that no dict grows large enough for an insert to
    rehash a million entries while the projection's lock is held. Packed as one map
    (``pack_side``)."""

    def __init__(self, parts: list[dict[int, Any]]) -> None:
        self.parts = parts

    def __getitem__(self, key: int) -> Any:
        for part in self.parts:
            if key in part:
                return part[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self.parts)

    def __len__(self) -> int:
        return sum(map(len, self.parts))


class MapsCopy:
    """A copy of a projection's id, keyword and term-count maps taken apart from it: begun
    holding its lock (its seqs listed, then sorted without it), read ``MAPS_CHUNK`` seqs at a
    time under the lock into a part each (``read``), finished holding it (``finish``): the seqs
    changed since it began are dropped from their parts and those still there copied again into
    a last one. The maps' values are replaced, never changed, so a copied value stays right
    until its seq changes."""

    def __init__(self, proj: Projection) -> None:
        self.proj = proj
        self.chunk = MAPS_CHUNK
        self.changed: set[int] = set()
        #: the parts of the ids, keywords and term-count maps, chunk by chunk
        self.parts: tuple[list[dict[int, Any]], ...] = ([], [], [])
        with proj.lock:
            proj._changed.append(self.changed)
            seqs = list(proj.ids)
        self._seqs = np.sort(np.array(seqs, dtype=np.int64))

    def read(self) -> None:
        for start in range(0, len(self._seqs), self.chunk):
            seqs = self._seqs[start : start + self.chunk].tolist()
            with self.proj.lock:
                for maps, part in zip(self.parts, self._copy(seqs), strict=True):
                    maps.append(part)

    def finish(self) -> tuple[Parts, Parts, Parts]:
        """The maps as the projection holds them now (call holding its lock, after ``read``)."""
        changed = sorted(self.changed)
        at = np.searchsorted(self._seqs, changed).tolist()
        for seq, pos in zip(changed, at, strict=True):
            if pos < len(self._seqs) and self._seqs[pos] == seq:
                for maps in self.parts:
                    maps[pos // self.chunk].pop(seq, None)
        last = self._copy(changed)
        ids, keywords, terms = ([*maps, part] for maps, part in zip(self.parts, last, strict=True))
        return Parts(ids), Parts(keywords), Parts(terms)

    def _copy(self, seqs: list[int]) -> tuple[dict[int, Any], ...]:
        """The entries of ``seqs`` the projection holds, as a part of each map."""
        proj = self.proj
        ids, keywords, docs = proj.ids, proj.keywords, proj.lexical.docs
        present = [seq for seq in seqs if seq in ids]  # no object the collector counts
        return (
            {seq: ids[seq] for seq in present},
            {seq: keywords[seq] for seq in present},
            {seq: docs[seq] for seq in present},
        )


def snapshot_path(ctx: Source, ns: str) -> Path:
    digest = hashlib.sha1(f"{ctx.keys.prefix}/{ns}".encode()).hexdigest()[:20]
    return ctx.settings.index_dir / f"{digest}.faiss"


def open_projection(ctx: Source, ns: str) -> Projection:
    """Load the namespace's snapshot and catch up, or rebuild it from Redis."""
    proj = _load_snapshot(ctx, ns)
    if proj is None:
        proj = Projection(ns, _new_index(ctx), _new_lexical(ctx))
        rebuild(ctx, proj)
    catch_up(ctx, proj)
    return proj


def _new_lexical(ctx: Source) -> LexicalIndex:
    return LexicalIndex(ctx.settings.bm25_k1, ctx.settings.bm25_b)


def _new_index(ctx: Source) -> VectorIndex:
    s = ctx.settings
    return VectorIndex(
        ctx.embedder.dim,
        ann_threshold=s.ann_threshold,
        ann=s.ann_index,
        hnsw_m=s.hnsw_m,
        ef_search=s.hnsw_ef_search,
        ef_construction=s.hnsw_ef_construction,
        nprobe=s.ivf_nprobe,
    )


def rebuild(ctx: Source, proj: Projection) -> None:
    """Rebuild from the namespace's active notes; the change log then covers later writes."""
    started = time.perf_counter()
    r, keys, ns = ctx.redis, ctx.keys, proj.ns
    last = r.xrevrange(keys.changes(ns), count=1)
    proj.index = _new_index(ctx)
    proj.ids.clear()
    proj.keywords.clear()
    proj.lexical = _new_lexical(ctx)
    proj.position = last[0][0].decode() if last else "0-0"
    members = r.zrange(keys.active(ns), 0, -1, withscores=True)
    for start in range(0, len(members), REBUILD_CHUNK):
        chunk = [(m.decode(), int(s)) for m, s in members[start : start + REBUILD_CHUNK]]
        _add_from_notes(ctx, proj, chunk, rebuild=True)
    log.info(
        "rebuilt ns=%s notes=%d in %.1fms",
        ns,
        len(proj.ids),
        (time.perf_counter() - started) * 1000,
    )


def _add_from_notes(
    ctx: Source, proj: Projection, members: list[tuple[str, int]], rebuild: bool = False
) -> None:
    """Add the active notes among ``members``; a note whose vector comes from another embedder
    is left out (and dropped if present), so one index never mixes two models' vectors. A
    vector index rebuild is done on the way only with ``rebuild`` (a cold load: nothing
    searches the projection yet), else left to ``Projection.settle``."""
    fields = ["vec", "keywords", "status", "seq", "content", "embedder"]
    pipe = BulkPipeline(ctx.redis)
    for nid, _ in members:
        pipe.queue("HMGET", ctx.keys.note(proj.ns, nid), *fields)
    seqs, ids, vecs, kws, terms, foreign = [], [], [], [], [], []
    model = ctx.embedder.name.encode()
    for (nid, seq), row in zip(members, pipe.execute(), strict=True):
        vec, raw_kws, status, raw_seq, content, embedder = row
        if vec is None or status != b"active" or raw_seq is None or int(raw_seq) != seq:
            continue
        if embedder != model:
            foreign.append(seq)
            continue
        seqs.append(seq)
        ids.append(nid)
        vecs.append(vectors.decode(vec))
        kws.append(msgpack.unpackb(raw_kws) if raw_kws else [])
        terms.append(analyze(content.decode()))
    if seqs:
        proj.add(seqs, ids, np.vstack(vecs), kws, terms, rebuild=rebuild)
    if foreign:
        proj.remove(foreign)
        log.warning(
            "ns=%s: %d notes embedded by another model left out of the index until "
            "`zettelq reembed %s`",
            proj.ns,
            len(foreign),
            proj.ns,
        )


def catch_up(ctx: Source, proj: Projection, prefetched: Prefetched | None = None) -> int:
    """Apply change-log entries after ``proj.position``; rebuild if some were trimmed away.

    ``prefetched`` is (position, entries) as a caller read them after that position (the search's
    first round trip does); they save a round trip while the projection is still there."""
    r, key = ctx.redis, ctx.keys.changes(proj.ns)
    applied = 0
    while True:
        if prefetched is not None and prefetched[0] == proj.position:
            entries = prefetched[1]
        else:
            entries = r.xrange(key, min=f"({proj.position}", count=CATCH_UP_CHUNK)
        fetched_in_full = len(entries) == CATCH_UP_CHUNK
        prefetched = None
        if not entries:
            return applied
        if applied == 0 and proj.position != "0-0" and _trimmed_past(ctx, proj):
            log.warning("change log of ns=%s trimmed past this projection; rebuilding", proj.ns)
            rebuild(ctx, proj)
            continue
        _apply_entries(ctx, proj, entries)
        applied += len(entries)
        if not fetched_in_full:
            return applied


def _trimmed_past(ctx: Source, proj: Projection) -> bool:
    first = ctx.redis.xrange(ctx.keys.changes(proj.ns), count=1)
    return bool(first) and stream_pos(first[0][0]) > stream_pos(proj.position)


def _apply_entries(
    ctx: Source, proj: Projection, entries: list[tuple[bytes, dict[bytes, bytes]]]
) -> None:
    adds: dict[int, str] = {}
    removes: list[int] = []
    for _, fields in entries:
        op, items = read_change(fields)
        for seq, nid in items:
            if op == "add":
                adds[seq] = nid
            else:
                adds.pop(seq, None)
                removes.append(seq)
    proj.remove(removes)
    _add_from_notes(ctx, proj, [(nid, seq) for seq, nid in adds.items()])
    proj.position = entries[-1][0].decode()


@contextmanager
def _locked(path: Path, *, shared: bool) -> Iterator[None]:
    """Hold the snapshot's file lock: its index file and sidecar are two files, each replaced
    atomically, so processes of one host that hold the same namespace save and load the pair
    one at a time (an index from one save with the sidecar of another would lose notes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".lock").open("a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class Frozen:
    """What a snapshot writes, copied from a projection at one position (``freeze``) so that the
    slow part, packing and writing it, holds no lock the projection's users wait on."""

    ns: str
    index: VectorIndex
    side: dict[str, Any]

    def release(self) -> None:
        """Drop the maps a part at a time, letting other threads run between parts: the three
        maps of a million notes freed at once hold the GIL (every thread of the process stands
        still) for ~70 ms. Call once the snapshot is written."""
        for value in self.side.values():
            if isinstance(value, Parts):
                while value.parts:
                    value.parts.pop()


def freeze(ctx: Source, proj: Projection, settle: Callable[[], object] | None = None) -> Frozen:
    """Copy what a snapshot of ``proj`` holds, holding ``proj.lock`` only for moments: the vector
    index and the id, keyword and term maps are copied apart (an IVF index list by list,
    ``VectorIndex.copying``; the maps ``MAPS_CHUNK`` notes at a time, ``MapsCopy``), then,
    holding the lock, ``settle`` runs (the snapshotter catches up there) and both copies are
    finished with what changed meanwhile, at the position saved with them. Call without the lock
    (with it, it is held throughout)."""
    index = proj.index
    with index.copying(proj.lock) as copy, proj.copying_maps() as maps:
        copy.read()
        maps.read()
        with proj.lock:
            if settle is not None:
                settle()
            if proj.index is not index:  # rebuilt from Redis meanwhile: copied again, held
                return freeze(ctx, proj)
            ids, keywords, terms = maps.finish()
            side = {
                "format": SNAPSHOT_FORMAT,
                "ns": proj.ns,
                "position": proj.position,
                "embedder": ctx.embedder.name,
                "ids": ids,
                "keywords": keywords,
                "terms": terms,
            }
            return Frozen(proj.ns, copy.finish(), side)


def write_snapshot(ctx: Source, frozen: Frozen) -> Path:
    """Write a frozen projection to ``index_dir`` (atomically) so a restart only catches up."""
    path = snapshot_path(ctx, frozen.ns)
    packed = pack_side(frozen.side)
    with _locked(path, shared=False):
        frozen.index.save(path)
        tmp = path.with_suffix(".meta.tmp")
        tmp.write_bytes(packed)
        tmp.replace(path.with_suffix(".meta"))
    return path


def pack_side(side: dict[str, Any], chunk: int = PACK_CHUNK) -> bytes:
    """``msgpack.packb(side)`` to the byte (a ``Parts`` packed as the map it holds), its maps
    packed ``chunk`` entries at a time: one call packing a million-note map holds the GIL for a
    second, stalling the process's drain and searches; between chunks other threads run."""
    out = [_map_header(len(side))]
    for key, value in side.items():
        out.append(_packb(key))
        if not isinstance(value, dict | Parts):
            out.append(_packb(value))
            continue
        out.append(_map_header(len(value)))
        for part in value.parts if isinstance(value, Parts) else [value]:
            items = list(part)
            for start in range(0, len(items), chunk):
                sub = {k: part[k] for k in items[start : start + chunk]}
                out.append(_packb(sub)[len(_map_header(len(sub))) :])
    return b"".join(out)


def _packb(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def _map_header(size: int) -> bytes:
    """msgpack's map header for ``size`` entries (fixmap, map 16 or map 32)."""
    if size < 16:
        return bytes([0x80 | size])
    if size < 1 << 16:
        return b"\xde" + size.to_bytes(2, "big")
    return b"\xdf" + size.to_bytes(4, "big")


def unpack_side(raw: bytes) -> dict[Any, Any]:
    """``msgpack.unpackb(raw, use_list=False)`` of a sidecar (a map), its maps and arrays read
    an entry at a time: one call unpacking a million-note map holds the GIL for seconds,
    stalling the process's drains and searches of other namespaces while it opens this one;
    between entries other threads run. Arrays come as tuples, which the garbage collector stops
    tracking (a list per note kept the collections that the read itself sets off walking them
    all: ~200 ms each at 300k notes). Raises what ``unpackb`` would for data that is not one
    such map."""
    unpacker = msgpack.Unpacker(
        io.BytesIO(raw), raw=False, strict_map_key=False, use_list=False, read_size=SIDE_READ_SIZE
    )
    unpack = unpacker.unpack
    side: dict[Any, Any] = {}
    for _ in range(unpacker.read_map_header()):
        key = unpack()
        kind = raw[unpacker.tell() : unpacker.tell() + 1]
        if kind and kind[0] in MSGPACK_MAPS:
            side[key] = {unpack(): unpack() for _ in range(unpacker.read_map_header())}
        elif kind and kind[0] in MSGPACK_ARRAYS:
            side[key] = tuple(unpack() for _ in range(unpacker.read_array_header()))
        else:
            side[key] = unpack()
    if unpacker.tell() != len(raw):
        raise msgpack.ExtraData(side, raw[unpacker.tell() :])
    return side


def _pairs(raw: Any) -> Iterable[tuple[Any, Any]]:
    """(seq, value) pairs of a sidecar map (format 3) or list of pairs (format 2)."""
    return raw.items() if isinstance(raw, dict) else raw


def _load_snapshot(ctx: Source, ns: str) -> Projection | None:
    path = snapshot_path(ctx, ns)
    meta = path.with_suffix(".meta")
    if not meta.exists():  # never saved: no lock file either (a search of an unknown namespace)
        return None
    try:
        with _locked(path, shared=True):
            if not path.exists() or not meta.exists():
                return None
            side = unpack_side(meta.read_bytes())
            index = VectorIndex.load(path)
    except (IndexCorrupt, ValueError, OSError, msgpack.UnpackException) as exc:
        log.warning("snapshot of ns=%s unusable (%s); rebuilding from Redis", ns, exc)
        return None
    if (side.get("ns"), side.get("embedder")) != (ns, ctx.embedder.name):
        return None
    if side.get("format") not in READ_FORMATS:
        return None
    s = ctx.settings
    if (index.ann, index.ann_threshold) != (s.ann_index, s.ann_threshold):
        log.info("snapshot of ns=%s has other index settings; rebuilding from Redis", ns)
        return None
    index.nprobe, index.ef_search = s.ivf_nprobe, s.hnsw_ef_search
    proj = Projection(ns, index, _new_lexical(ctx))
    proj.ids = {int(s): nid for s, nid in _pairs(side["ids"])}
    proj.keywords = {int(s): tuple(k) for s, k in _pairs(side["keywords"])}
    for seq, counts in _pairs(side.get("terms", [])):
        proj.lexical.add(int(seq), Counter(counts).elements())
    proj.position = side["position"]
    log.info("loaded snapshot ns=%s notes=%d position=%s", ns, len(proj.ids), proj.position)
    return proj
