"""The read side of the LangGraph store (pure, no I/O): checking a batch's ops, planning its
reads, filters with InMemoryStore's and Postgres's rules, and building the results of get,
search and list_namespaces from note hashes and zettelq hits.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgpack
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

from producer.adapters.langgraph.mapping import (
    META,
    check_labels,
    covers,
    decode_namespace,
    encode_namespace_or_none,
    note_id,
)
from producer.errors import InvalidInput
from producer.protocol import Hit

NOTE_FIELDS = ("status", "metadata", "created_at")  #: note hash fields an item is read from
ORDER: dict[str, Callable[[float, float], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}
OPERATORS = frozenset({"$eq", "$ne", *ORDER})  #: filter operators


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


def visible(names: Iterable[bytes], keys: Mapping[str, str]) -> list[str]:
    """The registered namespaces this producer may read, sorted: all of them, or, when it
    holds namespace keys (signatures on), only those it holds a key for, so that a tenant's
    store neither lists nor searches another tenant's namespaces."""
    decoded = (name.decode() for name in names)
    return sorted(ns for ns in decoded if not keys or ns in keys)


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
    """A note hash read with HMGET NOTE_FIELDS, with its namespace and id."""

    namespace: str
    id: str
    fields: list[Any]


def entry_of(
    namespace: str, nid: str, fields: Sequence[Any]
) -> tuple[dict[str, Any], float] | None:
    """The item entry and creation time of an active note, when it is the item its entry
    names (its id is that key's), else None."""
    status, packed, created = fields
    if status != b"active" or packed is None:
        return None
    entry = msgpack.unpackb(packed, raw=False).get(META)
    return (entry, float(created)) if is_item(namespace, nid, entry) else None


def is_item(namespace: str, nid: str, entry: object) -> bool:
    """Whether a note's item entry belongs to it: not a note of the namespace's own that
    merely carries the metadata key."""
    return isinstance(entry, dict) and note_id(namespace, str(entry.get("key"))) == nid


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


def get_result(op: GetOp, namespace: str, nid: str, fields: Sequence[Any]) -> Item | None:
    found = entry_of(namespace, nid, fields)
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


def search_k(op: SearchOp, max_k: int) -> int:
    """Hits to ask zettelq for: enough for the page, all it gives when a filter drops some."""
    return max_k if op.filter else min(max_k, max(op.offset + op.limit, 1))


def scored_items(op: SearchOp, hits: Sequence[Hit]) -> list[SearchItem]:
    """The items among a query's hits, best first, that are indexed and pass the filter."""
    out: dict[tuple[str, str], SearchItem] = {}
    for hit in sorted(hits, key=lambda h: -h.score):
        entry = hit.metadata.get(META)
        if not isinstance(entry, dict) or not is_item(hit.namespace, hit.id, entry):
            continue
        if (
            not entry.get("indexed")
            or (hit.namespace, entry["key"]) in out
            or not matches(entry["value"], op.filter)
        ):
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
        found = entry_of(*row)
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
