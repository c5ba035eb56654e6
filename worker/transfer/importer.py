"""``zettelq import``: queue the notes of a file on their namespace's inbox (docs/transfer.md).

Reads a zettelq export (restore jobs: each note comes back exactly as exported, see
worker/intake/restore.py), JSONL of ``{"content": ...}`` lines or plain text, one note per line
(store jobs: organised like any store), or mem0's ``get_all()`` output (store jobs, mapped as
``mem0_item`` says). Every line is checked before it is queued, and queued whole or not at all.

Idempotent and resumable: ids are kept (a line without one gets an id derived from its
content), an id that already is a note of the namespace is skipped, an id seen earlier in the
file is skipped, and a restore of an id that is a note by the time a worker applies it is a
no-op. A second import adds nothing; a re-run after an interruption duplicates nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from pydantic import ValidationError
from redis import Redis

from producer import validation as v
from producer.connection import data_redis
from producer.core import ENQUEUE_LUA, ClientCore, redis_errors
from producer.errors import Backpressure, InvalidInput
from producer.protocol import PROTOCOL_VERSION, RestoreJob, pack
from worker.intake.restore import check_restore
from worker.settings import WorkerSettings
from worker.transfer.export import FORMAT_VERSION

log = logging.getLogger(__name__)

FORMATS = ("auto", "zettelq", "jsonl", "text", "mem0")  #: what ``import --format`` takes
DEFAULT_BATCH = 500  #: lines queued per round trip (``zettelq import --batch``'s default)
#: fields a ``{"content": ...}`` line may carry (store()'s arguments)
STORE_LINE_FIELDS = frozenset(
    {"content", "id", "agent", "metadata", "tags", "event_time", "importance"}
)
#: mem0 fields kept under the ``mem0`` metadata key of an imported memory
MEM0_KEPT = (
    "user_id",
    "agent_id",
    "run_id",
    "actor_id",
    "role",
    "hash",
    "created_at",
    "updated_at",
)
BACKPRESSURE_WAIT_S = 0.05  #: first wait before queueing again when the inbox is full
MAX_BACKPRESSURE_WAIT_S = 2.0  #: longest such wait


class ImportLineError(InvalidInput):
    """A line (or, in a mem0 file, an entry) could not be read as a note; ``.line`` is its
    number, counted from 1."""

    def __init__(self, line: int, reason: str, what: str = "line") -> None:
        super().__init__(f"{what} {line}: {reason}")
        self.line = line


@dataclass
class Summary:
    """What an import did; ``failure`` is the bad line that stopped it, if one did."""

    format: str
    read: int = 0
    imported: int = 0
    skipped: int = 0
    errors: int = 0
    failure: ImportLineError | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "imported": self.imported,
            "skipped": self.skipped,
            "errors": self.errors,
            "format": self.format,
        }


@dataclass(frozen=True)
class Item:
    """One note read from the file, as the packed job to queue."""

    line: int
    id: str
    payload: bytes


Parsed = tuple[Item | ImportLineError, int]  #: a note or a bad line, and the bytes it took


@dataclass(frozen=True)
class Target:
    """Where the notes go: the namespace, the settings that check them, the job builder."""

    ns: str
    settings: WorkerSettings
    core: ClientCore


def import_stream(
    settings: WorkerSettings,
    ns: str,
    stream: IO[bytes],
    *,
    fmt: str = "auto",
    batch: int = DEFAULT_BATCH,
    skip_errors: bool = False,
    advance: Callable[[int], None] | None = None,
) -> Summary:
    """Import every note of ``stream`` into ``ns``. A bad line stops the import (after queueing
    the lines before it) unless ``skip_errors``, which counts and logs it instead."""
    core = ClientCore(settings)
    target = Target(core.namespace(ns), settings, core)
    r = data_redis(settings, socket_timeout=settings.socket_timeout_s)
    try:
        fmt, parsed = parse(target, stream, fmt)
        summary = Summary(fmt)
        _queue_all(r, target, parsed, summary, batch, skip_errors, advance)
        return summary
    finally:
        r.close()


def _queue_all(
    r: Redis,
    target: Target,
    parsed: Iterable[Parsed],
    summary: Summary,
    batch: int,
    skip_errors: bool,
    advance: Callable[[int], None] | None,
) -> None:
    pending: list[Item] = []
    seen: set[str] = set()
    for got, size in parsed:
        summary.read += 1
        if advance is not None:
            advance(size)
        if isinstance(got, ImportLineError):
            summary.errors += 1
            if not skip_errors:
                summary.failure = got
                break
            log.warning("skipped %s", got)
            continue
        if got.id in seen:
            summary.skipped += 1
            continue
        seen.add(got.id)
        pending.append(got)
        if len(pending) >= batch:
            _queue(r, target, pending, summary)
            pending = []
    if pending:
        _queue(r, target, pending, summary)


def _queue(r: Redis, target: Target, items: list[Item], summary: Summary) -> None:
    """Queue the items whose ids are not notes of the namespace yet, in one script call."""
    keys, ns = target.core.keys, target.ns
    with redis_errors():
        pipe = r.pipeline(transaction=False)
        for item in items:
            pipe.hexists(keys.note(ns, item.id), "seq")
        fresh = [item for item, known in zip(items, pipe.execute(), strict=True) if not known]
        summary.skipped += len(items) - len(fresh)
        if fresh:
            _enqueue(r, target, [item.payload for item in fresh])
    summary.imported += len(fresh)


def _enqueue(r: Redis, target: Target, payloads: list[bytes]) -> None:
    """Append to the shard inbox, in parts no larger than its bound (``max_pending``), each
    waiting while the backlog leaves no room for it."""
    bound = target.settings.max_pending
    size = bound if 0 < bound < len(payloads) else len(payloads)
    for start in range(0, len(payloads), size):
        _enqueue_part(r, target, payloads[start : start + size])


def _enqueue_part(r: Redis, target: Target, payloads: list[bytes]) -> None:
    keys = target.core.keys
    inbox = keys.inbox(keys.shard_of(target.ns))
    wait_s = BACKPRESSURE_WAIT_S
    while True:
        try:
            with redis_errors():
                r.eval(ENQUEUE_LUA, 1, inbox, target.settings.max_pending, *payloads)
            return
        except Backpressure:
            time.sleep(wait_s)  # the workers drain the inbox meanwhile; nothing to block on
            wait_s = min(wait_s * 2, MAX_BACKPRESSURE_WAIT_S)


# ----------------------------------------------------------------------------------- parsing


def parse(target: Target, stream: IO[bytes], fmt: str) -> tuple[str, Iterator[Parsed]]:
    """The file's format (detected when ``fmt`` is auto) and its notes, in file order."""
    if fmt not in FORMATS:
        raise InvalidInput(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    first = stream.readline()
    lines = itertools.chain([first], stream)
    if fmt == "auto":
        fmt = detect(first)
    if fmt == "mem0":
        return fmt, _mem0_items(target, b"".join(lines))
    reader = {"zettelq": _restore_item, "jsonl": _store_line, "text": _text_line}[fmt]
    return fmt, _lines(target, lines, reader, header=fmt == "zettelq")


def detect(first: bytes) -> str:
    """The format a file's first line says: a zettelq header, a JSON object with content, the
    start of a JSON document (mem0), else plain text."""
    text = first.strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return "mem0" if text[:1] in (b"{", b"[") else "text"
    if isinstance(obj, dict) and "zettelq_export" in obj:
        return "zettelq"
    if isinstance(obj, dict) and "content" in obj:
        return "jsonl"
    return "mem0" if isinstance(obj, dict | list) else "text"


Reader = Callable[[Target, int, str], Item]


def _lines(
    target: Target, lines: Iterable[bytes], reader: Reader, *, header: bool
) -> Iterator[Parsed]:
    for number, raw in enumerate(lines, start=1):
        if header and number == 1:
            _check_header(raw)
            continue
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            yield ImportLineError(number, "not UTF-8 text"), len(raw)
            continue
        if not text:
            continue
        try:
            yield reader(target, number, text), len(raw)
        except ImportLineError as exc:
            yield exc, len(raw)


def _check_header(raw: bytes) -> None:
    try:
        head = json.loads(raw)
    except ValueError as exc:
        raise ImportLineError(1, "the header is not JSON") from exc
    got = head.get("zettelq_export") if isinstance(head, dict) else None
    if got != FORMAT_VERSION:
        raise ImportLineError(
            1, f"export format version {got!r}; this zettelq reads {FORMAT_VERSION}"
        )


def _json_object(number: int, text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ImportLineError(number, f"not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ImportLineError(number, f"a note line is a JSON object, got {type(obj).__name__}")
    return obj


def _restore_item(target: Target, number: int, text: str) -> Item:
    obj = {**_json_object(number, text), "v": PROTOCOL_VERSION, "op": "restore", "ns": target.ns}
    obj.pop("sig", None)
    try:
        job = RestoreJob.model_validate(obj)
        check_restore(job, target.settings)
    except ValidationError as exc:
        raise ImportLineError(number, _first_error(exc)) from exc
    except InvalidInput as exc:
        raise ImportLineError(number, str(exc)) from exc
    return Item(number, job.id, pack(target.core.signed(obj, [target.ns])))


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "line"
    return f"{where}: {err['msg']}"


def _store_line(target: Target, number: int, text: str) -> Item:
    obj = _json_object(number, text)
    unknown = set(obj) - STORE_LINE_FIELDS
    if unknown:
        raise ImportLineError(number, f"unknown fields {sorted(unknown)}")
    return _store_item(target, number, obj)


def _text_line(target: Target, number: int, text: str) -> Item:
    return _store_item(target, number, {"content": text})


def _store_item(target: Target, number: int, obj: Mapping[str, Any], what: str = "line") -> Item:
    fields = dict(obj)
    content = fields.pop("content", None)
    if fields.get("id") is None and isinstance(content, str):
        fields["id"] = content_id(content)
    try:
        note_id, payload = target.core.store_payload(content, target.ns, **fields)
    except InvalidInput as exc:
        raise ImportLineError(number, str(exc), what) from exc
    return Item(number, note_id, payload)


def content_id(content: str) -> str:
    """The id of an imported note that has none: 32 hex characters of its content's SHA-256,
    so importing the same text again names the same note."""
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _mem0_items(target: Target, data: bytes) -> Iterator[Parsed]:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ImportLineError(1, f"not a JSON document ({exc})") from exc
    entries = doc.get("results") if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        raise ImportLineError(1, 'a mem0 export is {"results": [...]} or a list of memories')
    for number, entry in enumerate(entries, start=1):
        try:
            yield _store_item(target, number, mem0_item(number, entry), "entry"), 1
        except ImportLineError as exc:
            yield exc, 1


def mem0_item(number: int, entry: object) -> dict[str, Any]:
    """One mem0 memory as store() fields: ``memory`` is the content; ``id`` is kept when it is
    a valid zettelq id; ``metadata`` is kept, with the mem0 fields (MEM0_KEPT) under its
    ``mem0`` key; ``agent_id`` (else ``user_id``) is the agent; ``created_at`` is the event
    time; ``categories`` are tags."""
    if not isinstance(entry, dict) or not isinstance(entry.get("memory"), str):
        raise ImportLineError(number, 'a mem0 memory is an object with a "memory" str', "entry")
    given = entry.get("metadata")
    meta: dict[str, Any] = given if isinstance(given, dict) else {}
    kept = {k: entry[k] for k in MEM0_KEPT if entry.get(k) is not None}
    item: dict[str, Any] = {
        "content": entry["memory"],
        "metadata": {**meta, "mem0": kept} if kept else meta,
        "agent": entry.get("agent_id") or entry.get("user_id"),
        "event_time": entry.get("created_at"),
        "tags": entry.get("categories") or None,
    }
    if isinstance(entry.get("id"), str) and v.ID_RE.fullmatch(entry["id"]):
        item["id"] = entry["id"]
    return item
