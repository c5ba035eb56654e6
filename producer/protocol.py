"""The wire schema between producers and workers, and the note record both sides read.

Jobs and replies are msgpack maps validated by the pydantic models below. Models ignore unknown
fields so that a newer producer can add optional ones; a job whose ``v`` is not
``PROTOCOL_VERSION`` is refused by the worker (dead-lettered with its reason).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from producer.errors import ProtocolError

PROTOCOL_VERSION = 1  #: bumped on any incompatible change of the models below

M = TypeVar("M", bound=BaseModel)

JsonValue = Any  #: a msgpack-able value: None, bool, int, float, str, bytes, list, dict


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    v: int = PROTOCOL_VERSION


class JobHead(_Wire):
    """The fields every inbox job has; read first to pick the model and check the version."""

    op: str = ""
    ns: str = ""


class StoreJob(_Wire):
    """Create a note, or update it when the id exists (the update is audited)."""

    op: Literal["store"] = "store"
    id: str
    ns: str
    content: str
    agent: str | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    event_time: float | None = None
    importance: float | None = None
    created_at: float
    sig: str | None = None
    tp: str | None = None  #: W3C traceparent of the producer's span (producer/tracing.py)


class DeleteJob(_Wire):
    """Tombstone a note and remove its links on both sides."""

    op: Literal["delete"] = "delete"
    id: str
    ns: str
    agent: str | None = None
    created_at: float
    sig: str | None = None
    tp: str | None = None


class LinkSide(BaseModel):
    """One end of a link as exported and restored: its weight and metadata (relation label,
    reason, provenance, time; other metadata keys, such as a supersession's ``why``, are kept
    as extra fields)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    weight: float
    label: str = ""
    reason: str = ""
    source: str = ""
    at: float | None = None


class RestoreLink(LinkSide):
    """A link of a restored note to ``target``: this note's end, and the target's end
    (``back``) when that differs."""

    target: str
    back: LinkSide | None = None


class RestoreJob(_Wire):
    """Write a note exactly as exported (``zettelq import``, docs/transfer.md): its fields,
    its links to notes already there, and the cluster an insight abstracts. Never re-judged or
    re-linked; a no-op when the id is already a note. ``created_at`` is the note's own."""

    op: Literal["restore"] = "restore"
    id: str
    ns: str
    content: str
    kind: str = "note"
    keywords: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    context: str = ""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    agent: str | None = None
    created_at: float
    updated_at: float | None = None
    event_time: float | None = None
    valid_to: float | None = None
    superseded_by: str | None = None
    importance: float = 0.5
    importance_auto: float | None = None  #: the importance job's last score
    importance_prior: float | None = None  #: the importance the caller or judge gave
    access_count: int = 0
    last_access: float = 0.0
    version: int = 1
    status: Literal["active", "tombstoned"] = "active"
    merged_from: list[str] = Field(default_factory=list)
    merged_into: str | None = None
    links: list[RestoreLink] = Field(default_factory=list)
    cluster: list[str] | None = None
    sig: str | None = None
    tp: str | None = None  #: W3C traceparent of the importer's span


class SearchJob(_Wire):
    """A request a search thread serves: ``search``, ``context``, ``flush`` (wait until
    organised) or ``embed`` (vectors of ``texts`` by the worker's embedder); queued where
    ``Keys.search_queue_of`` says (worker/search/routing.py)."""

    job_id: str
    kind: Literal["search", "context", "flush", "embed"] = "search"
    namespaces: list[str]
    query: str = ""
    texts: list[str] = Field(default_factory=list)
    k: int = 10
    hops: int = 1
    filters: dict[str, JsonValue] = Field(default_factory=dict)
    weights: dict[str, float] = Field(default_factory=dict)
    as_of: float | None = None
    diversity: float = 0.0
    min_relevance: float = 0.0
    fresh: bool = True
    reinforce: bool = True  #: count the hits as retrieved (access_count, last_access)
    max_tokens: int = 2000
    deadline: float
    sig: str | None = None
    tp: str | None = None  #: W3C traceparent of the caller's span


class OrganiseJob(_Wire):
    """Run periodic jobs now for one namespace (all of them when ``jobs`` is None), after
    organising what is queued for it. With ``wait`` the worker replies, unless ``deadline``
    passed before it started; without, it runs whenever a worker takes it."""

    job_id: str
    namespace: str
    jobs: list[str] | None = None
    wait: bool = True
    deadline: float
    sig: str | None = None

    @property
    def kind(self) -> str:
        return "organise"


class Hit(BaseModel):
    """One search result with the parts of its score."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    id: str
    namespace: str
    content: str
    score: float
    relevance: float = 0.0
    similarity: float
    lexical: float = 0.0
    importance: float
    recency: float
    connection_boost: float
    hop: int = 0
    kind: str = "note"
    keywords: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    links: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    agent: str | None = None
    created_at: float = 0.0
    event_time: float | None = None
    valid_to: float | None = None
    superseded_by: str | None = None
    #: neighbour -> the link's relation label (see docs/architecture.md, "Linking")
    link_labels: dict[str, str] = Field(default_factory=dict)


class JobRun(BaseModel):
    """One run of a periodic job over one namespace: when it started, the work it did (notes
    scored, insights written, notes evicted, ...) and how long it took."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    job: str
    at: float
    work: int
    seconds: float


class Reply(_Wire):
    """The worker's answer to a SearchJob or OrganiseJob, LPUSHed to ``keys.reply(job_id)``."""

    job_id: str
    ok: bool = True
    error: str | None = None
    hits: list[Hit] = Field(default_factory=list)
    text: str = ""
    runs: list[JobRun] = Field(default_factory=list)
    #: an ``embed`` reply: one float32 little-endian row per text, and the embedder's name
    vectors: list[bytes] = Field(default_factory=list)
    embedder: str = ""


class Note(BaseModel):
    """A note as stored in its Redis hash (``keys.note``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    id: str
    namespace: str
    content: str
    kind: str = "note"
    keywords: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    context: str = ""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    agent: str | None = None
    created_at: float = 0.0
    event_time: float | None = None
    valid_to: float | None = None
    importance: float = 1.0
    access_count: int = 0
    last_access: float = 0.0
    status: Literal["active", "tombstoned"] = "active"
    version: int = 1
    embedder: str = ""
    seq: int = 0
    links: dict[str, float] = Field(default_factory=dict)
    superseded_by: str | None = None
    merged_from: list[str] = Field(default_factory=list)
    #: neighbour -> the link's relation label (see docs/architecture.md, "Linking")
    link_labels: dict[str, str] = Field(default_factory=dict)


#: Note hash fields whose values are msgpack-packed (the others are plain strings/numbers).
PACKED_FIELDS = frozenset(
    {"keywords", "tags", "metadata", "agent", "event_time", "valid_to", "merged_from"}
)
#: Note hash fields that hold raw bytes and are never part of the Note model.
RAW_FIELDS = frozenset({"vec", "src"})
#: First byte of a vector stored as float16 (ZQ_VECTOR_STORAGE=float16; worker/vectors.py): one
#: tag byte then 2 bytes per dimension, an odd length; a float32 vector is 4 bytes per dimension.
VECTOR_TAG_FLOAT16 = b"h"


def vector_values(raw: bytes) -> list[float]:
    """The floats of a stored vector in either layout; struct.error when it is neither."""
    if len(raw) % 2 and raw[:1] == VECTOR_TAG_FLOAT16:
        return list(struct.unpack(f"<{(len(raw) - 1) // 2}e", raw[1:]))
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def note_from_hash(
    fields: Mapping[bytes, bytes],
    links: Mapping[str, float] | None = None,
    link_labels: Mapping[str, str] | None = None,
) -> Note:
    """Decode a note hash read with HGETALL (bytes keys and values)."""
    data: dict[str, Any] = {}
    for raw_key, raw_value in fields.items():
        key = raw_key.decode()
        if key in RAW_FIELDS:
            continue
        data[key] = msgpack.unpackb(raw_value) if key in PACKED_FIELDS else raw_value.decode()
    if links is not None:
        data["links"] = dict(links)
    if link_labels is not None:
        data["link_labels"] = dict(link_labels)
    try:
        return Note.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError(f"cannot decode note {data.get('id')!r}") from exc


def pack(message: BaseModel | Mapping[str, Any]) -> bytes:
    """Serialise a model or a plain mapping to msgpack bytes."""
    data = _fields(message) if isinstance(message, BaseModel) else message
    try:
        return msgpack.packb(data, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot pack {type(message).__name__}: {exc}") from exc


def _fields(model: BaseModel) -> dict[str, Any]:
    """``model.model_dump()`` of a wire model, in a third of the time for a search reply: the
    fields of these models hold plain msgpack values, or lists of models (a reply's hits and
    runs), so a model's field dict is packed as it is once those lists are dumped in turn."""
    data = dict(vars(model))
    for name, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], BaseModel):
            data[name] = [_fields(item) for item in value]
    return data


def unpack(model: type[M], data: bytes) -> M:
    """Decode msgpack bytes into ``model``; any failure is a ProtocolError."""
    return validate(model, unpack_raw(data, model.__name__))


def unpack_raw(data: bytes, what: str = "job") -> Any:
    """Decode msgpack bytes (to validate with ``validate``, maybe as more than one model)."""
    try:
        return msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"cannot decode {what}: {exc}") from exc


def validate(model: type[M], obj: Any) -> M:
    """``obj`` (decoded msgpack) as ``model``; any failure is a ProtocolError."""
    try:
        return model.model_validate(obj)
    except (ValueError, TypeError, ValidationError) as exc:
        raise ProtocolError(f"cannot decode {model.__name__}: {exc}") from exc


#: A link as stored in its note's links hash (one per direction): the weight (float64, little
#: endian), the length of its relation label (one byte) and the label (UTF-8; empty for the
#: default, DEFAULT_LABEL), then the msgpack array of the rest of its metadata: the values of
#: LINK_META in that order (nil when absent, trailing nils left out; a source in LINK_SOURCES as
#: its index), then a map of any other keys. The weight and the label, which every search reads,
#: come out without unpacking anything. A reason that repeats what the link holds already is kept
#: short: ``true`` when it is the label (a sequence link's "sequence"), ``[rest]`` when it is
#: COSINE_REASON of the weight followed by ``rest`` (a similarity link's "cosine 0.28; shared
#: ..."). Links written before this layout hold one msgpack map of the metadata instead, and
#: links written with every reason as text read the same too.
LINK_HEAD = struct.Struct("<dB")
MAX_LABEL_BYTES = 255
DEFAULT_LABEL = "related"  #: the relation of a link that names none
#: Metadata every link carries, stored by position rather than by name (17 bytes less per link
#: end, so a links hash stays small; bench/README.md, "Redis memory per note").
LINK_META = ("reason", "source", "at")
#: The sources zettelq's own jobs write, stored as their index here (a small int instead of up to
#: 20 bytes per link end). Append only: a stored index must keep naming the same source.
LINK_SOURCES = (
    "rule:similarity",
    "rule:sequence",
    "consolidation",
    "merge",
    "importance",
    "supersession",
    "supersession:revert",
)
_SOURCE_INDEX = {name: i for i, name in enumerate(LINK_SOURCES)}
#: How the similarity rule's reasons begin: the cosine, which the weight of its link holds.
COSINE_REASON = "cosine {:.2f}"


def pack_link(weight: float, meta: Mapping[str, Any]) -> bytes:
    rest = dict(meta)
    label = _label_bytes(str(rest.pop("label", None) or ""))
    row: list[Any] = [rest.pop(name, None) for name in LINK_META]
    if row[0] is not None:
        row[0] = _short_reason(weight, row[0], label)
    row[1] = _SOURCE_INDEX.get(row[1], row[1]) if isinstance(row[1], str) else row[1]
    if rest:
        row.append(rest)
    while row and row[-1] is None:
        row.pop()
    return LINK_HEAD.pack(weight, len(label)) + label + bytes(msgpack.packb(row))


def link_packer(source: str, at: float) -> Callable[[float, str, str], bytes]:
    """``pack_link`` for many links of one source written at one time: ``pack(weight, reason,
    label)`` gives the bytes of ``pack_link(weight, {"reason": reason, "label": label, "source":
    source, "at": at})`` at a third of the cost (an ingest batch writes thousands of link ends).
    """
    tail = bytes(msgpack.packb(_SOURCE_INDEX.get(source, source)) + msgpack.packb(at))
    labels: dict[str, bytes] = {}
    head, packb = LINK_HEAD.pack, msgpack.packb

    def pack(weight: float, reason: str, label: str) -> bytes:
        text = labels.get(label)
        if text is None:
            text = labels[label] = _label_bytes(label)
        # a fixarray of the LINK_META values: reason, source, at
        short = packb(_short_reason(weight, reason, text))
        packed: bytes = head(weight, len(text)) + text + b"\x93" + short + tail
        return packed

    return pack


def _short_reason(weight: float, reason: Any, label: bytes) -> Any:
    """What a link stores of its reason (see LINK_HEAD): ``True`` for its label (as read),
    ``[rest]`` for COSINE_REASON of its weight then ``rest``, else the text itself."""
    if not isinstance(reason, str):
        if isinstance(reason, bool | list):
            raise ValueError("a link reason is text")
        return reason
    if reason == (label.decode() or DEFAULT_LABEL):
        return True
    cosine = COSINE_REASON.format(weight)
    return [reason[len(cosine) :]] if reason.startswith(cosine) else reason


def _full_reason(weight: float, stored: Any, label: str) -> Any:
    """The reason a link stored as ``stored`` gives (``_short_reason`` undone)."""
    if stored is True:
        return label
    if isinstance(stored, list) and len(stored) == 1 and isinstance(stored[0], str):
        return COSINE_REASON.format(weight) + stored[0]
    return stored


def _label_bytes(label: str) -> bytes:
    text = b"" if label == DEFAULT_LABEL else label.encode()
    if len(text) > MAX_LABEL_BYTES:
        raise ValueError(f"a link label takes at most {MAX_LABEL_BYTES} bytes")
    return text


def link_weight(raw: bytes) -> float:
    return float(LINK_HEAD.unpack_from(raw)[0])


def link_label(raw: bytes | None) -> str:
    """The relation label of a packed link (DEFAULT_LABEL when it names none; "" when there is
    no link)."""
    if not raw:
        return ""
    end = LINK_HEAD.size + raw[LINK_HEAD.size - 1]
    return raw[LINK_HEAD.size : end].decode() or DEFAULT_LABEL


def unpack_link(raw: bytes) -> tuple[float, dict[str, Any]]:
    """The weight and the metadata of a packed link; a link with any metadata has a label (the
    default when it names none)."""
    weight, size = LINK_HEAD.unpack_from(raw)
    start = LINK_HEAD.size + size
    rest = msgpack.unpackb(raw[start:], raw=False) if len(raw) > start else {}
    label = raw[LINK_HEAD.size : start].decode() or DEFAULT_LABEL
    meta = _link_rest(rest, weight, label)
    if size or meta:
        meta = {"label": label, **meta}
    return float(weight), meta


def _link_rest(rest: Any, weight: float, label: str) -> dict[str, Any]:
    """The metadata of a packed link's tail: a LINK_META row (then a map of other keys), or the
    map of everything that older links hold."""
    if isinstance(rest, dict):
        return rest
    if not isinstance(rest, list):
        return {}
    row = zip(LINK_META, rest[: len(LINK_META)], strict=False)  # a row may end early
    meta = {name: value for name, value in row if value is not None}
    if "reason" in meta:
        meta["reason"] = _full_reason(weight, meta["reason"], label)
    source = meta.get("source")
    if isinstance(source, int) and not isinstance(source, bool):
        meta["source"] = LINK_SOURCES[source] if 0 <= source < len(LINK_SOURCES) else str(source)
    extra = rest[len(LINK_META)] if len(rest) > len(LINK_META) else None
    return {**meta, **extra} if isinstance(extra, dict) else meta


def link_meta(raw: bytes | None) -> dict[str, Any]:
    """The metadata of a packed link ({} when there is no link or it carries none)."""
    return unpack_link(raw)[1] if raw else {}


def link_weights(reply: Mapping[bytes, bytes] | list[bytes]) -> dict[str, float]:
    """A links hash read whole (HGETALL, RESP2 flat or a map) as neighbour -> weight."""
    if isinstance(reply, Mapping):
        return {nb.decode(): link_weight(raw) for nb, raw in reply.items()}
    return {reply[i].decode(): link_weight(reply[i + 1]) for i in range(0, len(reply), 2)}


def new_id() -> str:
    """A new note or job id: 48 bits of milliseconds then 80 random bits, 32 hex characters.

    Ids sort by creation time and never collide in practice.
    """
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


class Neighbour(BaseModel):
    """A note reached by ``connected()``: how far it is and through which link."""

    model_config = ConfigDict(frozen=True)
    id: str
    hop: int
    via: str
    weight: float
    content: str
    label: str = ""  #: relation label of the link from ``via``


class Stats(BaseModel):
    """What ``stats()`` reports for one namespace."""

    model_config = ConfigDict(frozen=True)
    namespace: str
    notes: int
    links: int
    pending: int
    tombstoned: int
    dead: int
    index_kind: str = ""
    index_size: int = 0
    last: dict[str, float] = Field(default_factory=dict)
    jobs: dict[str, JobRun] = Field(default_factory=dict)  #: last run of each periodic job here
    #: organisation counters: insights, superseded, merged, links_capped, and the LLM work
    #: (llm_calls, llm_tokens, llm_prompt_tokens, llm_completion_tokens, llm_failures,
    #: llm_fail_<reason>, judge_*, construct_*, evolve_*)
    counters: dict[str, int] = Field(default_factory=dict)


class Organised(BaseModel):
    """What ``organise()`` returns: the runs of each job, in the order they ran (empty and
    ``done=False`` when it did not wait)."""

    model_config = ConfigDict(frozen=True)
    namespace: str
    job_id: str
    done: bool
    runs: list[JobRun] = Field(default_factory=list)

    @property
    def work(self) -> dict[str, int]:
        """Work done per job."""
        return {r.job: r.work for r in self.runs}


class Proposal(BaseModel):
    """A change evolution proposed (or made) to one note's fields (``proposals()``)."""

    model_config = ConfigDict(frozen=True)
    id: str
    namespace: str
    note: str  #: the note it changes
    status: Literal["pending", "applied", "rejected", "reverted"]
    fields: list[str]  #: the note fields it changes
    before: dict[str, JsonValue] = Field(default_factory=dict)  #: their values before
    after: dict[str, JsonValue] = Field(default_factory=dict)  #: and after
    source: str  #: what proposed it: "rule" or "model:<name>"
    reason: str = ""
    triggers: list[str] = Field(default_factory=list)  #: the new notes whose links set it off
    batch: list[str] = Field(default_factory=list)  #: the inbox entries that wrote them
    created_at: float
    updated_at: float  #: time of the last status change
