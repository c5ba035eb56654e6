"""The pure part of the LangGraph store (producer/adapters/langgraph.py): how namespaces, keys
and values map onto notes, batch planning, filters, search and list_namespaces results. No I/O.

An item is the note ``lg-<hash of namespace and key>`` in the zettelq namespace of its LangGraph
namespace. Its metadata holds ``{"langgraph": {"key", "value", "indexed", "at"}}`` (``at``: the
time of the last put, which is also the note's event_time); its content is the text at the
index paths (the key when nothing is indexed).
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple
from urllib.parse import unquote

import msgpack

try:
    from langgraph.store.base import (
        GetOp,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        SearchItem,
        SearchOp,
    )
    from langgraph.store.base.embed import get_text_at_path
except ImportError as exc:
    raise ImportError(
        "the zettelq LangGraph store needs LangGraph: pip install 'zettelq[langgraph]'"
    ) from exc

from producer import validation as v
from producer.core import ClientCore
from producer.errors import InvalidInput
from producer.protocol import Hit

META = "langgraph"  #: metadata key holding the item
ID_PREFIX = "lg-"  #: note ids of items: lg-<32 hex>
ID_PERSON = b"zettelq:lg"  #: BLAKE2b personalisation of item ids
DEFAULT_FIELDS = ("$",)  #: index paths of a put that names none: the whole value, as JSON
MAX_SEARCH_NAMESPACES = 16  #: namespaces one zettelq search covers; more go in groups
NOTE_FIELDS = ("status", "metadata", "created_at")  #: note hash fields an item is read from
LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_@/-]")  #: label characters written as :XX per byte
ORDER: dict[str, Callable[[float, float], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}
OPERATORS = frozenset({"$eq", "$ne", *ORDER})  #: filter operators


@functools.lru_cache(maxsize=4_096)
def encode_namespace(namespace: tuple[str, ...]) -> str:
    """The zettelq namespace of a LangGraph namespace: the labels joined by ".", each
    character outside ``A-Z a-z 0-9 _ @ / -`` written as ``:XX`` per UTF-8 byte (so neither
    "." nor ":" occurs unescaped in a label, and ``decode_namespace`` reverses it).
    ``InvalidInput`` when the result passes zettelq's 128 characters."""
    check_labels(namespace)
    try:
        name = ".".join(LABEL_UNSAFE.sub(_escape, label) for label in namespace)
    except UnicodeEncodeError as exc:
        raise InvalidNamespaceError(f"namespace {namespace!r:.80} is not valid Unicode") from exc
    if len(name) > 128:
        raise InvalidInput(
            f"namespace {namespace!r:.80} encodes to {len(name)} characters; the limit is 128"
            " (characters outside A-Z a-z 0-9 _ @ / - take 3 per UTF-8 byte)"
        )
    return v.check_namespace(name)


def _escape(match: re.Match[str]) -> str:
    return "".join(f":{byte:02X}" for byte in match.group().encode())


def decode_namespace(name: str) -> tuple[str, ...]:
    return tuple(unquote(label.replace(":", "%"), errors="strict") for label in name.split("."))


def encode_namespace_or_none(namespace: tuple[str, ...]) -> str | None:
    """The encoded namespace, or None when it is too long to hold any item."""
    try:
        return encode_namespace(namespace)
    except InvalidNamespaceError:
        raise
    except InvalidInput:
        return None


def check_labels(namespace: object) -> None:
    """LangGraph's label rules: a tuple of non-empty str labels without "." or NUL."""
    if not isinstance(namespace, tuple):
        raise InvalidNamespaceError(f"a namespace is a tuple of str, got {namespace!r:.80}")
    for label in namespace:
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise InvalidNamespaceError(
                f"namespace labels must be non-empty str without '.' or NUL, got {label!r:.80}"
            )


def note_id(namespace: str, key: str) -> str:
    """The stable note id of ``key`` in the (encoded) ``namespace``: ``lg-`` and the 128-bit
    BLAKE2b hash of both, in hex."""
    if not isinstance(key, str):
        raise InvalidInput(f"key must be a str, got {type(key).__name__}")
    try:
        name = f"{namespace}\n{key}".encode()
    except UnicodeEncodeError as exc:
        raise InvalidInput("key is not valid Unicode text (lone surrogate)") from exc
    return ID_PREFIX + hashlib.blake2b(name, digest_size=16, person=ID_PERSON).hexdigest()


def check_ops(ops: Sequence[Op]) -> None:
    """Refuse a batch before anything is read or written: bad labels, an empty or "langgraph"
    root namespace for a put, a TTL (not supported), an unknown filter operator."""
    for op in ops:
        if isinstance(op, ListNamespacesOp):
            for cond in op.match_conditions or ():
                check_labels(tuple(label for label in cond.path if label != "*"))
            continue
        check_labels(op.namespace_prefix if isinstance(op, SearchOp) else op.namespace)
        if isinstance(op, PutOp):
            if not op.namespace or op.namespace[0] == "langgraph":
                raise InvalidNamespaceError(
                    f'a namespace is non-empty and its root is not "langgraph": {op.namespace}'
                )
            if op.ttl is not None:
                raise NotImplementedError("ZettelqStore does not support TTL (supports_ttl=False)")
        if isinstance(op, SearchOp):
            _check_filter(op.filter or {})


def _check_filter(wanted: Mapping[str, Any]) -> None:
    for key, value in wanted.items():
        if key.startswith("$") and key not in OPERATORS:
            raise InvalidInput(f"unknown filter operator {key!r}; use one of {sorted(OPERATORS)}")
        if isinstance(value, Mapping):
            _check_filter(value)


def matches(value: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """Whether an item's value passes a search filter (InMemoryStore's and Postgres's rules):
    every top-level key must match; a mapping of operators applies each; another mapping
    matches nested keys; a list matches element by element; else equality. The order
    operators compare as numbers and are false when either side is not one."""
    return all(_compare(value.get(k), w) for k, w in (wanted or {}).items())


def _compare(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        if any(k.startswith("$") for k in wanted):
            return all(_apply(actual, op, arg) for op, arg in wanted.items())
        return isinstance(actual, Mapping) and matches(actual, wanted)
    if isinstance(wanted, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


def _apply(actual: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(actual == arg)
    if op == "$ne":
        return bool(actual != arg)
    left, right = _number(actual), _number(arg)
    return left is not None and right is not None and ORDER[op](left, right)


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class Writes:
    """A batch's puts, ready to send: (namespace, packed job) in op order after last write
    wins, the namespaces written and those that received an item."""

    payloads: list[tuple[str, bytes]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)

    def commands(
        self, core: ClientCore, sha: str, tracker: WriteTracker
    ) -> list[tuple[object, ...]]:
        """The Redis commands that send the batch: per shard stream one EVALSHA of the enqueue
        script (``sha``) with that stream's payloads in op order, then one SADD of the
        namespaces ``tracker`` has not registered yet."""
        keys = core.keys
        by_inbox: dict[str, list[bytes]] = {}
        for ns, payload in self.payloads:
            by_inbox.setdefault(keys.inbox(keys.shard_of(ns)), []).append(payload)
        bound = core.settings.max_pending
        out: list[tuple[object, ...]] = [
            ("EVALSHA", sha, 1, inbox, bound, *payloads) for inbox, payloads in by_inbox.items()
        ]
        new = tracker.unregistered(self.registered)
        if new:
            out.append(("SADD", keys.langgraph_namespaces(), *new))
        return out


class WriteTracker:
    """What one store has written and not yet flushed, per namespace (thread-safe), the time
    of each put (strictly increasing within the store) and the agent its notes are stored as."""

    def __init__(self, agent: str | None = None) -> None:
        self._agent = v.check_agent(agent)
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}
        self._flushed: dict[str, int] = {}
        self._registered: set[str] = set()
        self._last_at = 0.0

    def plan(self, puts: Sequence[PutOp], core: ClientCore, fields: Sequence[str]) -> Writes:
        last = {(op.namespace, op.key): op for op in puts}
        writes = Writes()
        for op in last.values():
            ns = encode_namespace(op.namespace)
            nid = note_id(ns, op.key)
            if op.value is None:
                writes.payloads.append((ns, core.delete_payload(nid, ns)))
            else:
                item = store_fields(op, fields, self._now())
                content = item.pop("content")
                _, payload = core.store_payload(content, ns, id=nid, agent=self._agent, **item)
                writes.payloads.append((ns, payload))
                writes.registered.append(ns)
            writes.namespaces.append(ns)
        writes.namespaces = list(dict.fromkeys(writes.namespaces))
        writes.registered = list(dict.fromkeys(writes.registered))
        return writes

    def _now(self) -> float:
        with self._lock:
            self._last_at = max(time.time(), self._last_at + 1e-6)
            return self._last_at

    def written(self, writes: Writes) -> None:
        """``writes`` reached Redis: their namespaces are dirty and registered."""
        with self._lock:
            for ns in writes.namespaces:
                self._written[ns] = self._written.get(ns, 0) + 1
            self._registered.update(writes.registered)

    def unregistered(self, namespaces: Iterable[str]) -> list[str]:
        with self._lock:
            return [ns for ns in namespaces if ns not in self._registered]

    def dirty(self) -> list[str]:
        with self._lock:
            return [ns for ns, n in self._written.items() if n > self._flushed.get(ns, 0)]

    def due(self, namespaces: Iterable[str]) -> dict[str, int]:
        """Of ``namespaces``, those written since their last flush, with their write count."""
        with self._lock:
            return {
                ns: self._written[ns]
                for ns in dict.fromkeys(namespaces)
                if self._written.get(ns, 0) > self._flushed.get(ns, 0)
            }

    def flushed(self, namespace: str, seen: int) -> None:
        """Every write counted up to ``seen`` is organised (a flush began after it)."""
        with self._lock:
            self._flushed[namespace] = max(self._flushed.get(namespace, 0), seen)


def store_fields(op: PutOp, fields: Sequence[str], at: float) -> dict[str, Any]:
    """store() arguments of a put: content (the text at the index paths, else the key),
    metadata holding the item, event_time ``at`` (distinct per put, so that near-duplicate
    merge, which needs equal event times, never merges two items)."""
    value = json_value(op.value)
    paths = [] if op.index is False else list(fields if op.index is None else op.index)
    text = "\n".join(t for p in paths for t in get_text_at_path(value, p) if t.strip())
    indexed = bool(text.strip())
    entry = {"key": op.key, "value": value, "indexed": indexed, "at": at}
    content = text if indexed else (op.key if op.key.strip() else "langgraph item")
    return {"content": content, "metadata": {META: entry}, "event_time": at}


def json_value(value: object) -> dict[str, Any]:
    """The value after a JSON round trip (what Postgres's store keeps), or InvalidInput."""
    if not isinstance(value, Mapping):
        raise InvalidInput(f"a value is a mapping, got {type(value).__name__}")
    try:
        out: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"a value must be JSON: {exc}") from exc
    return out


@dataclass
class Read:
    """The reads of a batch by kind, each with its position in the batch."""

    gets: list[tuple[int, str, str]] = field(default_factory=list)  #: (i, namespace, note id)
    get_ops: list[tuple[int, GetOp]] = field(default_factory=list)
    searches: list[tuple[int, SearchOp]] = field(default_factory=list)
    lists: list[tuple[int, ListNamespacesOp]] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return bool(self.gets or self.searches or self.lists)

    @property
    def needs_registry(self) -> bool:
        return bool(self.searches or self.lists)

    def touched(self, dirty: list[str]) -> list[str]:
        """Namespaces to flush first: those of the gets, the dirty ones a search covers, every
        dirty one for a list_namespaces."""
        if self.lists:
            covered = dirty
        else:
            covered = [
                ns
                for ns in dirty
                if any(covers(op.namespace_prefix, ns) for _, op in self.searches)
            ]
        return [ns for _, ns, _ in self.gets] + covered


def plan_reads(ops: Sequence[Op]) -> Read:
    reads = Read()
    for i, op in enumerate(ops):
        if isinstance(op, GetOp):
            ns = encode_namespace_or_none(op.namespace)
            if ns is not None:
                reads.gets.append((i, ns, note_id(ns, op.key)))
                reads.get_ops.append((i, op))
        elif isinstance(op, SearchOp):
            reads.searches.append((i, op))
        elif isinstance(op, ListNamespacesOp):
            reads.lists.append((i, op))
    return reads


class Row(NamedTuple):
    """A note hash read with HMGET NOTE_FIELDS, and its namespace."""

    namespace: str
    fields: list[Any]


def entry_of(fields: Sequence[Any]) -> tuple[dict[str, Any], float] | None:
    """The item entry and creation time of an active item note, else None."""
    status, packed, created = fields
    if status != b"active" or packed is None:
        return None
    entry = msgpack.unpackb(packed, raw=False).get(META)
    return (entry, float(created)) if isinstance(entry, dict) else None


def _time(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


def to_item(
    namespace: str, entry: Mapping[str, Any], created: float, score: float | None = None
) -> SearchItem:
    return SearchItem(
        namespace=decode_namespace(namespace),
        key=entry["key"],
        value=entry["value"],
        created_at=_time(created),
        updated_at=_time(max(float(entry["at"]), created)),
        score=score,
    )


def get_result(op: GetOp, fields: Sequence[Any]) -> Item | None:
    found = entry_of(fields)
    if found is None or found[0].get("key") != op.key:
        return None
    entry, created = found
    return Item(
        value=entry["value"],
        key=op.key,
        namespace=op.namespace,
        created_at=_time(created),
        updated_at=_time(max(float(entry["at"]), created)),
    )


def covers(prefix: tuple[str, ...], namespace: str) -> bool:
    """Whether a search prefix covers a namespace: itself or a descendant, label by label."""
    return decode_namespace(namespace)[: len(prefix)] == prefix


def search_k(op: SearchOp, max_k: int) -> int:
    """Hits to ask zettelq for: enough for the page, all it gives when a filter drops some."""
    return max_k if op.filter else min(max_k, max(op.offset + op.limit, 1))


def scored_items(op: SearchOp, hits: Sequence[Hit]) -> list[SearchItem]:
    """The items among a query's hits, best first, that are indexed and pass the filter."""
    out: dict[tuple[str, str], SearchItem] = {}
    for hit in sorted(hits, key=lambda h: -h.score):
        entry = hit.metadata.get(META)
        if not isinstance(entry, dict) or not entry.get("indexed"):
            continue
        if (hit.namespace, entry["key"]) in out or not matches(entry["value"], op.filter):
            continue
        out[(hit.namespace, entry["key"])] = to_item(
            hit.namespace, entry, hit.created_at, hit.score
        )
    return list(out.values())


def search_result(
    op: SearchOp, scored: list[SearchItem], listing: Sequence[Row]
) -> list[SearchItem]:
    """The page of a search: the scored items, then the other matching items newest first
    (score None); without a query, all matching items newest first."""
    seen = {(item.namespace, item.key) for item in scored}
    rest: list[SearchItem] = []
    for row in listing:
        found = entry_of(row.fields)
        if found is None or not matches(found[0]["value"], op.filter):
            continue
        item = to_item(row.namespace, *found)
        if (item.namespace, item.key) not in seen:
            rest.append(item)
    rest.sort(key=lambda item: (-item.updated_at.timestamp(), item.namespace, item.key))
    return [*scored, *rest][op.offset : op.offset + op.limit]


def list_result(op: ListNamespacesOp, names: Iterable[str]) -> list[tuple[str, ...]]:
    """list_namespaces: the namespaces matching every condition, cut to max_depth, distinct,
    sorted, then the page."""
    conditions = op.match_conditions or ()
    kept = [ns for ns in map(decode_namespace, names) if all(_fits(c, ns) for c in conditions)]
    if op.max_depth is not None:
        kept = [ns[: op.max_depth] for ns in kept]
    return sorted(set(kept))[op.offset : op.offset + op.limit]


def _fits(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if not path:
        return True
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(want in ("*", got) for want, got in zip(path, part, strict=True))
