"""How LangGraph items map onto zettelq notes (pure, no I/O): namespaces, item ids, the
store() fields of a put, and the write side of a batch (last write wins, what this store has
written and not yet flushed).

An item is the note ``lg-<hash of namespace and key>`` in the zettelq namespace of its LangGraph
namespace. Its metadata holds ``{"langgraph": {"key", "value", "indexed", "at"}}`` (``at``: the
time of the last put, which is also the note's event_time); its content is the text at the
index paths (the key when nothing is indexed).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from langgraph.store.base import InvalidNamespaceError, PutOp
from langgraph.store.base.embed import get_text_at_path

from producer import tracing
from producer import validation as v
from producer.core import ClientCore
from producer.errors import InvalidInput

META = "langgraph"  #: metadata key holding the item
ID_PREFIX = "lg-"  #: note ids of items: lg-<32 hex>
ID_PERSON = b"zettelq:lg"  #: BLAKE2b personalisation of item ids
DEFAULT_FIELDS = ("$",)  #: index paths of a put that names none: the whole value, as JSON
MAX_SEARCH_NAMESPACES = 16  #: namespaces one zettelq search covers; more go in groups
LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_@/-]")  #: label characters written as :XX per byte


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


def covers(prefix: tuple[str, ...], namespace: str) -> bool:
    """Whether a search prefix covers a namespace: itself or a descendant, label by label."""
    return decode_namespace(namespace)[: len(prefix)] == prefix


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
        trace = tracing.traceparent()  # the batch's span, for every put in it
        for op in last.values():
            ns = encode_namespace(op.namespace)
            nid = note_id(ns, op.key)
            if op.value is None:
                writes.payloads.append((ns, core.delete_payload(nid, ns)))
            else:
                item = store_fields(op, fields, self._now())
                content = item.pop("content")
                _, payload = core.store_payload(
                    content, ns, trace, id=nid, agent=self._agent, **item
                )
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

    def written(self, writes: Writes, *, sent: bool) -> None:
        """A send of ``writes`` is over: their namespaces are dirty (counted only now, so that a
        flush that sees the count began after the jobs were queued; also when the send failed,
        since part of it may have been queued), and registered when it succeeded."""
        with self._lock:
            for ns in writes.namespaces:
                self._written[ns] = self._written.get(ns, 0) + 1
            if sent:
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
