"""CrewAI's memory on zettelq: ``ZettelqStorage``, a crewai (>= 1.10) ``StorageBackend`` for
``Memory(storage=...)``, and ``zettelq_embedder``, which makes CrewAI's vectors the worker's own.
Needs the ``crewai`` extra. See docs/crewai.md.

Scopes and namespaces: a record of scope ``/s1/s2/...`` lives in namespace ``NS/s1/.../sD``, its
first ``scope_depth`` segments (``NS`` alone with the default depth 0), each segment encoded by
``encode_segment``; the full scope is kept in the note and, past the depth, as one tag per
ancestor, so a scope prefix always matches whole segments (``/a/b`` never matches ``/a/bc``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from producer import validation as v
from producer.client import MemoryClient
from producer.connection import data_redis
from producer.core import redis_errors
from producer.errors import InvalidInput
from producer.protocol import note_from_hash, vector_values

try:
    from crewai.memory.storage.backend import EmbeddingDimensionMismatchError
    from crewai.memory.types import MemoryRecord, ScopeInfo
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the CrewAI door needs crewai: pip install 'zettelq[crewai]'") from exc

RECORD_KEY = "_crewai"  #: note metadata key holding the record fields zettelq has no field for
SCOPE_TAG = "crewai-scope:"  #: prefix of the tags that mark a note's ancestor scopes
MAX_SCOPE_DEPTH = 8  #: deepest scope_depth (namespaces are at most 128 characters anyway)
MEMO_SIZE = 4096  #: vectors zettelq_embedder remembers the text of, for text-native search
SEARCH_OVERSAMPLE = 3  #: candidates per wanted record when categories are filtered afterwards
MAX_SEARCH_NAMESPACES = 16  #: namespaces one zettelq search may cover
SPEC_SCHEME = "zettelq"  #: Memory(storage="zettelq://NAMESPACE?scope_depth=N")

_SAFE = re.compile(r"[A-Za-z0-9_.:-]")
_ESCAPE = re.compile(r"@([0-9a-f]{1,6})@")

Row = tuple[str, MemoryRecord]  #: (namespace, record)


def encode_segment(segment: str) -> str:
    """A scope segment as namespace characters: A-Z a-z 0-9 _ . : - stay, any other character
    becomes ``@<hex code point>@`` (``@`` itself too), so the encoding is reversible."""
    return "".join(c if _SAFE.fullmatch(c) else f"@{ord(c):x}@" for c in segment)


def decode_segment(encoded: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), encoded)


def scope_segments(scope: object) -> tuple[str, ...]:
    """The segments of a scope path; empty ones do not count (``/a//b/`` is ``/a/b``)."""
    if not isinstance(scope, str):
        raise InvalidInput(f"a scope must be a str path such as /team/alice, got {scope!r:.40}")
    return tuple(part for part in scope.split("/") if part)


def scope_path(segments: Sequence[str]) -> str:
    return "/" + "/".join(segments)


def namespace_of(base: str, segments: Sequence[str], depth: int) -> str:
    """The namespace that holds records of scope ``segments``."""
    return v.check_namespace(base + "".join("/" + encode_segment(s) for s in segments[:depth]))


def scope_of_namespace(base: str, namespace: str) -> tuple[str, ...] | None:
    """The scope segments a namespace stands for, or None when it is not under ``base``."""
    if namespace == base:
        return ()
    if not namespace.startswith(base + "/"):
        return None
    return tuple(decode_segment(part) for part in namespace[len(base) + 1 :].split("/"))


def scope_tag(segments: Sequence[str]) -> str:
    digest = hashlib.blake2b(scope_path(segments).encode(), digest_size=8).hexdigest()
    return SCOPE_TAG + digest


def scope_tags(segments: Sequence[str], depth: int) -> list[str]:
    """The tags of a record's ancestor scopes below its namespace, itself included."""
    return [scope_tag(segments[:n]) for n in range(depth + 1, len(segments) + 1)]


def within(segments: Sequence[str], prefix: Sequence[str]) -> bool:
    return tuple(segments[: len(prefix)]) == tuple(prefix)


def score(query: Sequence[float], vector: Sequence[float]) -> float:
    """CrewAI's LanceDB score, 1 / (1 + L2 distance): in (0, 1], 1 for the same vector."""
    if len(vector) != len(query):
        raise EmbeddingDimensionMismatchError(len(vector), len(query))
    return 1.0 / (1.0 + math.dist(query, vector))


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _like(epoch_s: float, model: datetime) -> datetime:
    """``epoch_s`` as a datetime as naive (UTC) or aware as ``model``."""
    moment = datetime.fromtimestamp(epoch_s, UTC)
    return moment if model.tzinfo else moment.replace(tzinfo=None)


def to_record(fields: dict[bytes, bytes]) -> MemoryRecord | None:
    """The CrewAI record a note hash holds; None for a note that is not active or was not
    written through ``ZettelqStorage`` (a consolidation insight, a plain ``store()``)."""
    if fields.get(b"status") != b"active":
        return None
    note = note_from_hash(fields)
    metadata = dict(note.metadata)
    kept = metadata.pop(RECORD_KEY, None)
    if not isinstance(kept, dict):
        return None
    created = datetime.fromisoformat(kept["created_at"])
    accessed = datetime.fromisoformat(kept["last_accessed"])
    if note.last_access > _utc(accessed).timestamp():
        accessed = _like(note.last_access, accessed)
    raw = fields.get(b"vec")
    return MemoryRecord(
        id=note.id,
        content=note.content,
        scope=kept["scope"],
        categories=kept["categories"],
        metadata=metadata,
        importance=note.importance,
        created_at=created,
        last_accessed=accessed,
        embedding=vector_values(raw) if raw else None,
        source=kept["source"],
        private=kept["private"],
    )


class _Memo:
    """Which text each recent vector of ``zettelq_embedder`` came from (bounded, thread-safe)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._texts: OrderedDict[tuple[float, ...], str] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, vector: Sequence[float], text: str) -> None:
        key = tuple(vector)
        with self._lock:
            self._texts[key] = text
            self._texts.move_to_end(key)
            while len(self._texts) > self._size:
                self._texts.popitem(last=False)

    def get(self, vector: Sequence[float]) -> str | None:
        with self._lock:
            return self._texts.get(tuple(vector))


_MEMO = _Memo(MEMO_SIZE)


class ZettelqEmbedder:
    """An embedding callable for ``Memory(embedder=...)``: texts -> the worker's vectors (one
    round trip per ``max_batch`` texts). It remembers the text of each vector it made, so that
    ``ZettelqStorage.search`` given such a vector runs zettelq's text-native hybrid search."""

    def __init__(self, client: MemoryClient, namespace: str | None = None) -> None:
        self.client = client
        self.namespace = namespace

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        texts = list(texts)
        step = self.client.settings.max_batch
        vectors: list[list[float]] = []
        for start in range(0, len(texts), step):
            vectors += self.client.embed(texts[start : start + step], namespace=self.namespace)
        for text, vector in zip(texts, vectors, strict=True):
            _MEMO.put(vector, text)
        return vectors


def zettelq_embedder(client: MemoryClient, namespace: str | None = None) -> ZettelqEmbedder:
    """The embedder to give CrewAI's ``Memory`` beside a ``ZettelqStorage``."""
    return ZettelqEmbedder(client, namespace)


class ZettelqStorage:
    """A crewai ``StorageBackend`` on zettelq: ``Memory(storage=ZettelqStorage(client, ...),
    embedder=zettelq_embedder(client))``.

    ``namespace`` (default: the client's) holds the records; ``scope_depth`` leading scope
    segments (default 0) pick a namespace of their own below it. Writes are the client's
    fire-and-forget stores and deletes; a read first flushes the namespaces this storage wrote
    to since its last read, so it sees its own writes (another process's only once organised).
    """

    def __init__(
        self, client: MemoryClient, namespace: str | None = None, *, scope_depth: int = 0
    ) -> None:
        s = client.settings
        self.client = client
        self.namespace = v.check_namespace(namespace or s.default_namespace)
        self.scope_depth = v.check_int(scope_depth, "scope_depth", 0, MAX_SCOPE_DEPTH)
        self._keys = client.keys
        self._redis = data_redis(s, socket_timeout=s.socket_timeout_s)
        self._dirty: set[str] = set()
        self._placed: dict[str, str] = {}  #: record id -> namespace, saved since the last flush
        self._lock = threading.Lock()

    # writes

    def save(self, records: list[MemoryRecord]) -> None:
        """Store the records (a record whose id exists replaces it, as ``update``)."""
        items: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            ns, item = self._item(record)
            items.setdefault(ns, []).append(item)
        step = self.client.settings.max_batch
        for ns, batch in items.items():
            for start in range(0, len(batch), step):
                self.client.store_many(batch[start : start + step], namespace=ns)
            self._touched(ns)
        if self.scope_depth:
            self._drop_moved({str(i["id"]): ns for ns, its in items.items() for i in its})

    def update(self, record: MemoryRecord) -> None:
        """Replace the record of the same id (the same note: its links and history stay)."""
        self.save([record])

    def delete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        """Tombstone the records matching every criterion given; return how many. Each is a
        zettelq delete: it leaves the index and loses its links on both sides."""
        rows = self._rows(scope_prefix, record_ids)
        if categories:
            rows = [(ns, r) for ns, r in rows if set(categories) & set(r.categories)]
        if older_than is not None:
            rows = [(ns, r) for ns, r in rows if _utc(r.created_at) < _utc(older_than)]
        if metadata_filter:
            rows = [(ns, r) for ns, r in rows if _matches(r.metadata, metadata_filter)]
        for ns, record in rows:
            self.client.delete(record.id, namespace=ns)
            self._touched(ns)
        return len(rows)

    def reset(self, scope_prefix: str | None = None) -> None:
        """Tombstone every record under ``scope_prefix`` (all of them when None)."""
        self.delete(scope_prefix=scope_prefix)

    def touch_records(self, record_ids: list[str]) -> None:
        """Count a retrieval of each record, as a zettelq search counts its hits:
        access_count + 1 and last_access = now, which importance and eviction reward."""
        rows = self._rows(None, record_ids)
        now = time.time()
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for ns, record in rows:
                key = self._keys.note(ns, record.id)
                pipe.hincrby(key, "access_count", 1)
                pipe.hset(key, "last_access", now)
            pipe.execute()

    # reads

    def search(
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        """Records by similarity to the query vector, best first, each with its score in
        (0, 1] (1 / (1 + L2 distance), as CrewAI's LanceDB storage) of at least ``min_score``.

        A vector ``zettelq_embedder`` made in this process is searched as its text with
        zettelq's hybrid search; any other vector is compared with every record in the scope."""
        v.check_int(limit, "limit", 1, self.client.settings.max_k)
        floor = v.check_unit_float(min_score, "min_score") or 0.0
        text = _MEMO.get(query_embedding)
        self._barrier()
        if text is None:
            rows = self._rows(scope_prefix)
        else:
            rows = self._hybrid(text, scope_prefix, categories, metadata_filter, limit)
        found = [
            (record, score(query_embedding, record.embedding or []))
            for _, record in rows
            if (not categories or set(categories) & set(record.categories))
            and (not metadata_filter or _matches(record.metadata, metadata_filter))
        ]
        found = [(r, s) for r, s in found if s >= floor]
        found.sort(key=lambda pair: -pair[1])
        return found[:limit]

    def get_record(self, record_id: str) -> MemoryRecord | None:
        rows = self._rows(None, [record_id])
        return rows[0][1] if rows else None

    def list_records(
        self, scope_prefix: str | None = None, limit: int = 200, offset: int = 0
    ) -> list[MemoryRecord]:
        """Records under ``scope_prefix``, newest (``created_at``) first."""
        if limit <= 0 or offset < 0:
            return []
        records = [r for _, r in self._rows(scope_prefix)]
        records.sort(key=lambda r: _utc(r.created_at), reverse=True)
        return records[offset : offset + limit]

    def get_scope_info(self, scope: str) -> ScopeInfo:
        prefix = scope_segments(scope)
        records = [r for _, r in self._rows(scope)]
        created = [r.created_at for r in records]
        return ScopeInfo(
            path=scope_path(prefix),
            record_count=len(records),
            categories=sorted({c for r in records for c in r.categories}),
            oldest_record=min(created, key=_utc) if created else None,
            newest_record=max(created, key=_utc) if created else None,
            child_scopes=_children(prefix, records),
        )

    def list_scopes(self, parent: str = "/") -> list[str]:
        """The immediate child scopes of ``parent`` that hold records."""
        return _children(scope_segments(parent), [r for _, r in self._rows(parent)])

    def list_categories(self, scope_prefix: str | None = None) -> dict[str, int]:
        return dict(Counter(c for _, r in self._rows(scope_prefix) for c in r.categories))

    def count(self, scope_prefix: str | None = None) -> int:
        return len(self._rows(scope_prefix))

    def close(self) -> None:
        """Close this storage's Redis connection (the client stays the caller's)."""
        self._redis.close()

    async def asave(self, records: list[MemoryRecord]) -> None:
        await asyncio.to_thread(self.save, records)

    async def asearch(
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        return await asyncio.to_thread(
            self.search,
            query_embedding,
            scope_prefix,
            categories,
            metadata_filter,
            limit,
            min_score,
        )

    async def adelete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        return await asyncio.to_thread(
            self.delete, scope_prefix, categories, record_ids, older_than, metadata_filter
        )

    # the mapping onto notes

    def _item(self, record: MemoryRecord) -> tuple[str, dict[str, Any]]:
        """The namespace and the ``store_many`` item of a record."""
        segments = scope_segments(record.scope)
        if RECORD_KEY in record.metadata:
            raise InvalidInput(f"record metadata must not use the key {RECORD_KEY!r}")
        kept = {
            "scope": record.scope,
            "categories": list(record.categories),
            "created_at": record.created_at.isoformat(),
            "last_accessed": record.last_accessed.isoformat(),
            "source": record.source,
            "private": record.private,
        }
        item = {
            "id": record.id,
            "content": record.content,
            "metadata": {**record.metadata, RECORD_KEY: kept},
            "tags": [*record.categories, *scope_tags(segments, self.scope_depth)],
            "importance": record.importance,
            "event_time": record.created_at,
            "agent": record.source or None,
        }
        return namespace_of(self.namespace, segments, self.scope_depth), item

    def _targets(self, scope_prefix: str | None) -> tuple[list[str], str | None]:
        """The namespaces that can hold records under ``scope_prefix``, and the scope tag that
        marks them within those (None when every record there is under it)."""
        prefix = scope_segments(scope_prefix or "/")
        if len(prefix) >= self.scope_depth:
            tag = scope_tag(prefix) if len(prefix) > self.scope_depth else None
            return [namespace_of(self.namespace, prefix, self.scope_depth)], tag
        with redis_errors():
            known = self._redis.smembers(self._keys.namespaces())
        names = []
        for raw in sorted(known):
            segments = scope_of_namespace(self.namespace, raw.decode())
            if segments is not None and within(segments, prefix):
                names.append(raw.decode())
        return names, None

    def _rows(
        self, scope_prefix: str | None, ids: Sequence[str] | None = None, *, fresh: bool = True
    ) -> list[Row]:
        """The records under ``scope_prefix`` (of ``ids`` only, when given), with their
        namespaces; ``fresh``: after flushing the namespaces this storage wrote to."""
        if fresh:
            self._barrier()
        prefix = scope_segments(scope_prefix or "/")
        namespaces, _ = self._targets(scope_prefix)
        wanted = None if ids is None else [i for i in dict.fromkeys(ids) if v.ID_RE.fullmatch(i)]
        with redis_errors():
            if wanted is None:
                pipe = self._redis.pipeline(transaction=False)
                for ns in namespaces:
                    pipe.zrange(self._keys.active(ns), 0, -1)
                pairs = [
                    (ns, raw.decode())
                    for ns, got in zip(namespaces, pipe.execute(), strict=True)
                    for raw in got
                ]
            else:
                pairs = [(ns, nid) for ns in namespaces for nid in wanted]
            pipe = self._redis.pipeline(transaction=False)
            for ns, nid in pairs:
                pipe.hgetall(self._keys.note(ns, nid))
            hashes = pipe.execute()
        rows = [(ns, to_record(fields)) for (ns, _), fields in zip(pairs, hashes, strict=True)]
        return [
            (ns, r) for ns, r in rows if r is not None and within(scope_segments(r.scope), prefix)
        ]

    def _hybrid(
        self,
        text: str,
        scope_prefix: str | None,
        categories: list[str] | None,
        metadata_filter: dict[str, Any] | None,
        limit: int,
    ) -> list[Row]:
        """The records zettelq's search finds for ``text`` under the scope prefix."""
        namespaces, tag = self._targets(scope_prefix)
        filters: dict[str, Any] = {"tags": [tag]} if tag else {}
        if metadata_filter:
            filters["metadata"] = metadata_filter
        k = min(limit * (SEARCH_OVERSAMPLE if categories else 1), self.client.settings.max_k)
        hits = []
        for start in range(0, len(namespaces), MAX_SEARCH_NAMESPACES):
            chunk = namespaces[start : start + MAX_SEARCH_NAMESPACES]
            hits += self.client.search(text, namespace=chunk, k=k, filters=filters, reinforce=False)
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for hit in hits:
                pipe.hgetall(self._keys.note(hit.namespace, hit.id))
            hashes = pipe.execute()
        rows = [
            (hit.namespace, to_record(fields)) for hit, fields in zip(hits, hashes, strict=True)
        ]
        return [(ns, r) for ns, r in rows if r is not None]

    def _drop_moved(self, targets: dict[str, str]) -> None:
        """Delete the notes of records re-saved under a scope of another namespace: those
        organised so far, and those this storage saved since its last flush (no flush here, so
        that a save never waits on a worker)."""
        found = {(ns, r.id) for ns, r in self._rows(None, list(targets), fresh=False)}
        with self._lock:
            found |= {(self._placed[i], i) for i in targets if i in self._placed}
            self._placed.update(targets)
        for ns, nid in sorted(found):
            if targets[nid] != ns:
                self.client.delete(nid, namespace=ns)
                self._touched(ns)

    def _touched(self, namespace: str) -> None:
        with self._lock:
            self._dirty.add(namespace)

    def _barrier(self) -> None:
        """Flush the namespaces written since the last read (read your writes)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            self._placed.clear()
        for ns in sorted(dirty):
            self.client.flush(ns)


def _matches(metadata: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(metadata.get(key) == value for key, value in wanted.items())


def _children(prefix: Sequence[str], records: Sequence[MemoryRecord]) -> list[str]:
    """The immediate child scopes of ``prefix`` among the records' scopes."""
    depth = len(prefix) + 1
    paths = {scope_path(s[:depth]) for s in map(scope_segments, (r.scope for r in records))}
    return sorted(p for p in paths if len(scope_segments(p)) == depth)


def storage_factory(client: MemoryClient) -> Callable[[str], ZettelqStorage | None]:
    """A factory for crewai's ``set_memory_storage_factory``: ``Memory(storage=
    "zettelq://NAMESPACE")`` (optionally ``?scope_depth=N``) gets a ``ZettelqStorage`` on
    ``client``; any other spec is left to CrewAI."""

    def build(spec: str) -> ZettelqStorage | None:
        parts = urlsplit(spec)
        if parts.scheme != SPEC_SCHEME:
            return None
        depth = parse_qs(parts.query).get("scope_depth", ["0"])[-1]
        if not depth.isdigit():
            raise InvalidInput(f"scope_depth in {spec!r} must be a whole number")
        namespace = (parts.netloc + parts.path) or None
        return ZettelqStorage(client, namespace, scope_depth=int(depth))

    return build
