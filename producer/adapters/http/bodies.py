"""The HTTP API's request and response bodies (the client's models carry the rest: Hit, Note,
Neighbour, Stats, Organised)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, JsonValue

from producer.protocol import Hit, Neighbour


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoreBody(_Body):
    """One note to store; only ``content`` is required."""

    content: str
    agent: str | None = None
    metadata: dict[str, JsonValue] | None = None
    tags: list[str] | None = None
    event_time: float | str | None = None  #: epoch seconds or ISO 8601
    importance: float | None = None
    id: str | None = None  #: makes the store idempotent


class BatchBody(_Body):
    notes: list[StoreBody]  #: 1 to ZQ_MAX_BATCH notes


class SearchBody(_Body):
    query: str
    k: int | None = None  #: 1 to ZQ_MAX_K (default 10)
    hops: int | None = None
    filters: dict[str, JsonValue] | None = None
    fresh: bool | None = None
    as_of: float | str | None = None
    diversity: float | None = None
    min_relevance: float | None = None
    weights: dict[str, float] | None = None
    timeout_s: float | None = None


class ContextBody(SearchBody):
    max_tokens: int | None = None  #: 16 to 1,000,000 (default 2000)


class FlushBody(_Body):
    timeout_s: float | None = None


class OrganiseBody(_Body):
    wait: bool = True
    timeout_s: float | None = None
    jobs: list[str] | None = None


class Stored(BaseModel):
    id: str


class StoredMany(BaseModel):
    ids: list[str]


class Hits(BaseModel):
    hits: list[Hit]


class ContextText(BaseModel):
    """Hits fenced as ``<memory>`` blocks of quoted data under a header that says so."""

    text: str


class Neighbours(BaseModel):
    neighbours: list[Neighbour]


class Flushed(BaseModel):
    namespace: str
    flushed: bool


class Health(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    type: str  #: the zettelq error class, e.g. InvalidInput, Unauthenticated, NotFound
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail
