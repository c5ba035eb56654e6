"""The clients agents use: ``MemoryClient`` (blocking) and ``AsyncMemoryClient`` (asyncio).

Writes are one round trip (an EVALSHA that appends to the namespace's shard stream) and never
wait for a worker. Searches push a job on the search list and BLPOP the reply key in the same
round trip.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from redis import Redis
from redis import asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from producer import signing
from producer import validation as v
from producer.errors import (
    AccessDenied,
    Backpressure,
    InvalidInput,
    JobFailed,
    NotFound,
    ReplyTimeout,
    Unavailable,
)
from producer.keys import Keys
from producer.protocol import (
    DeleteJob,
    Hit,
    Neighbour,
    Note,
    Reply,
    SearchJob,
    Stats,
    new_id,
    note_from_hash,
    pack,
    unpack,
)
from producer.settings import ProducerSettings

#: Appends jobs to a shard stream unless its backlog is over the bound. KEYS[1] inbox;
#: ARGV[1] max pending (0 = unbounded); ARGV[2..] packed jobs.
ENQUEUE_LUA = """
local bound = tonumber(ARGV[1])
if bound > 0 and redis.call('XLEN', KEYS[1]) + #ARGV - 1 > bound then
  return redis.error_reply('BACKPRESSURE shard backlog over ' .. bound)
end
for i = 2, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'j', ARGV[i])
end
return #ARGV - 1
"""

Namespaces = str | Sequence[str]


@contextmanager
def _redis_errors() -> Iterator[None]:
    try:
        yield
    except (AuthenticationError, AuthorizationError, NoPermissionError) as exc:
        raise AccessDenied(
            f"Redis refused access ({exc}); check the user and password in ZQ_REDIS_URL"
            " and the user's ACL rules"
        ) from exc
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise Unavailable(f"Redis unavailable: {exc}") from exc
    except ResponseError as exc:
        if str(exc).startswith("NOAUTH"):
            raise AccessDenied(
                f"Redis requires a password ({exc}); put it in ZQ_REDIS_URL"
            ) from exc
        if str(exc).startswith("BACKPRESSURE"):
            raise Backpressure(str(exc)) from exc
        raise


class _ClientCore:
    """Pure part of both clients: validates input, builds jobs, parses replies. No I/O."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix, settings.shard_count)
        self.signing_keys = {ns: k.get_secret_value() for ns, k in settings.namespace_keys.items()}

    def signed(self, job: dict[str, Any], namespaces: Sequence[str]) -> dict[str, Any]:
        """``job`` with its ``sig`` when this producer holds namespace keys (else unchanged)."""
        if self.signing_keys:
            job["sig"] = signing.sign(job, namespaces, self.signing_keys)
        return job

    def namespace(self, namespace: str | None) -> str:
        return v.check_namespace(namespace or self.settings.default_namespace)

    def store_payload(self, content: object, namespace: str, **fields: Any) -> tuple[str, bytes]:
        s = self.settings
        note_id = v.check_id(fields["id"]) if fields.get("id") is not None else new_id()
        job = {
            "v": 1,
            "op": "store",
            "id": note_id,
            "ns": namespace,
            "content": v.check_text(content, "content", s.max_content_bytes),
            "agent": v.check_agent(fields.get("agent")),
            "metadata": v.check_metadata(fields.get("metadata"), s.max_metadata_bytes),
            "tags": v.check_tags(fields.get("tags"), s.max_tags, s.max_tag_chars),
            "event_time": v.check_time(fields.get("event_time"), "event_time"),
            "importance": v.check_unit_float(fields.get("importance"), "importance"),
            "created_at": time.time(),
        }
        return note_id, pack(self.signed(job, [namespace]))

    def store_many_payloads(
        self, items: Sequence[str | Mapping[str, Any]], namespace: str
    ) -> tuple[list[str], list[bytes]]:
        if isinstance(items, str) or not isinstance(items, Sequence):
            raise InvalidInput("items must be a list of str or dict")
        if not 0 < len(items) <= self.settings.max_batch:
            raise InvalidInput(f"store_many takes 1 to {self.settings.max_batch} items")
        ids: list[str] = []
        payloads: list[bytes] = []
        for item in items:
            fields = {"content": item} if isinstance(item, str) else dict(item)
            unknown = set(fields) - STORE_FIELDS
            if unknown:
                raise InvalidInput(f"unknown item fields {sorted(unknown)}")
            note_id, payload = self.store_payload(fields.pop("content", None), namespace, **fields)
            ids.append(note_id)
            payloads.append(payload)
        if len(set(ids)) != len(ids):
            raise InvalidInput("store_many items carry the same id twice")
        return ids, payloads

    def delete_payload(self, note_id: str, namespace: str) -> bytes:
        job = DeleteJob(id=v.check_id(note_id), ns=namespace, created_at=time.time())
        return pack(self.signed(job.model_dump(), [namespace]))

    def search_job(self, kind: str, namespace: Namespaces | None, **fields: Any) -> SearchJob:
        s = self.settings
        unknown = set(fields) - SEARCH_OPTIONS
        if unknown:
            raise InvalidInput(f"unknown search options {sorted(unknown)}")
        names = [namespace] if namespace is None or isinstance(namespace, str) else namespace
        if not isinstance(names, list | tuple) or not 0 < len(names) <= 16:
            raise InvalidInput("namespace must be a str or a list of 1 to 16 str")
        timeout = fields.pop("timeout_s", None)
        timeout_s = v.check_timeout(s.reply_timeout_s if timeout is None else timeout)
        query = fields.pop("query", "")
        if kind != "flush":
            query = v.check_text(query, "query", s.max_content_bytes)
        job = SearchJob(
            job_id=new_id(),
            kind=kind,  # type: ignore[arg-type]
            namespaces=list(dict.fromkeys(self.namespace(n) for n in names)),
            query=query,
            k=v.check_int(fields.get("k", min(10, s.max_k)), "k", 1, s.max_k),
            hops=v.check_int(fields.get("hops", 1), "hops", 0, v.MAX_HOPS),
            filters=v.check_filters(fields.get("filters"), s),
            fresh=bool(fields.get("fresh", True)),
            weights=v.check_weights(fields.get("weights")),
            as_of=v.check_time(fields.get("as_of"), "as_of"),
            diversity=v.check_unit_float(fields.get("diversity"), "diversity") or 0.0,
            max_tokens=v.check_int(fields.get("max_tokens", 2000), "max_tokens", 16, 1_000_000),
            deadline=time.time() + timeout_s,
        )
        if not self.signing_keys:
            return job
        return job.model_copy(update={"sig": self.signed(job.model_dump(), job.namespaces)["sig"]})

    def parse_reply(self, raw: Any, job: SearchJob) -> Reply:
        if raw is None:
            raise ReplyTimeout(
                f"no reply to {job.kind} job_id={job.job_id} in time; is a worker running?"
            )
        reply = unpack(Reply, raw[1])
        if not reply.ok:
            raise JobFailed(reply.error or "unknown error")
        return reply

    def parse_note(self, namespace: str, note_id: str, fields: Any, links: Any) -> Note:
        if not fields or fields.get(b"status") != b"active":
            raise NotFound(f"no active note {note_id!r} in namespace {namespace!r}")
        return note_from_hash(fields, {k.decode(): float(w) for k, w in links})

    def parse_stats(self, namespace: str, replies: list[Any]) -> Stats:
        notes, tombstoned, pending, raw = replies
        counters = {k.decode(): v.decode() for k, v in raw.items()}
        return Stats(
            namespace=namespace,
            notes=notes,
            links=int(counters.get("links", 0)),
            pending=pending,
            tombstoned=tombstoned,
            dead=int(counters.get("dead", 0)),
            index_kind=counters.get("index_kind", ""),
            index_size=int(counters.get("index_size", 0)),
            last={k[5:]: float(t) for k, t in counters.items() if k.startswith("last_")},
        )


RETRY_BASE_S = 0.05  #: first backoff before a Redis command is retried
RETRY_CAP_S = 0.5  #: longest backoff between retries

#: Keyword arguments search(), context() and flush() accept.
SEARCH_OPTIONS = frozenset(
    {
        "query",
        "k",
        "hops",
        "filters",
        "fresh",
        "timeout_s",
        "weights",
        "as_of",
        "diversity",
        "max_tokens",
    }
)

#: Keyword names a store_many() item may carry.
STORE_FIELDS = frozenset({"content", "agent", "metadata", "tags", "event_time", "importance", "id"})


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(base=RETRY_BASE_S, cap=RETRY_CAP_S)


def redis_kwargs(s: ProducerSettings) -> dict[str, Any]:
    """Connection options every zettelq Redis client uses: connect timeout, health checks and
    bounded retries (ZQ_REDIS_RETRIES)."""
    return {
        "socket_connect_timeout": s.socket_timeout_s,
        "health_check_interval": 30,
        "retry": Retry(_backoff(), s.redis_retries),
    }


def _async_connect_kwargs(s: ProducerSettings) -> dict[str, Any]:
    return {**redis_kwargs(s), "retry": AsyncRetry(_backoff(), s.redis_retries)}


class MemoryClient:
    """Blocking client. Thread-safe: one instance can serve many threads."""

    def __init__(self, settings: ProducerSettings | None = None, **overrides: Any) -> None:
        self._core = _ClientCore(settings or ProducerSettings(**overrides))
        s = self._core.settings
        self.keys = self._core.keys
        self._redis = Redis.from_url(
            s.redis_url, socket_timeout=s.socket_timeout_s, **redis_kwargs(s)
        )
        self._blocking = Redis.from_url(s.redis_url, socket_timeout=None, **redis_kwargs(s))
        self._enqueue = self._redis.register_script(ENQUEUE_LUA)

    @property
    def settings(self) -> ProducerSettings:
        return self._core.settings

    def store(self, content: str, *, namespace: str | None = None, **fields: Any) -> str:
        """Queue one note; return its id at once. Fields: agent, metadata, tags, event_time,
        importance, id (makes the call idempotent)."""
        ns = self._core.namespace(namespace)
        unknown = set(fields) - STORE_FIELDS
        if unknown:
            raise InvalidInput(f"unknown store() arguments {sorted(unknown)}")
        note_id, payload = self._core.store_payload(content, ns, **fields)
        self._send(ns, [payload])
        return note_id

    def store_many(
        self, items: Sequence[str | Mapping[str, Any]], *, namespace: str | None = None
    ) -> list[str]:
        """Queue many notes of one namespace in one round trip; return their ids in order."""
        ns = self._core.namespace(namespace)
        ids, payloads = self._core.store_many_payloads(items, ns)
        self._send(ns, payloads)
        return ids

    def delete(self, note_id: str, *, namespace: str | None = None) -> None:
        """Queue the deletion of a note (applied in order after earlier stores)."""
        ns = self._core.namespace(namespace)
        self._send(ns, [self._core.delete_payload(note_id, ns)])

    def _send(self, ns: str, payloads: list[bytes]) -> None:
        inbox = self.keys.inbox(self.keys.shard_of(ns))
        with _redis_errors():
            self._enqueue(keys=[inbox], args=[self.settings.max_pending, *payloads])

    def search(
        self, query: str, *, namespace: Namespaces | None = None, **options: Any
    ) -> list[Hit]:
        """Best notes for ``query``. Options: k=10, hops=1, filters=None, fresh=True, timeout_s,
        as_of (see the past), diversity (0-1, MMR), weights (per-channel, for ablations)."""
        return self._ask("search", namespace, query=query, **options).hits

    def context(
        self,
        query: str,
        *,
        namespace: Namespaces | None = None,
        max_tokens: int = 2000,
        **options: Any,
    ) -> str:
        """Token-budgeted text of the best matches, each marked as stored data."""
        return self._ask("context", namespace, query=query, max_tokens=max_tokens, **options).text

    def flush(self, namespace: str | None = None, timeout_s: float | None = None) -> None:
        """Return once everything stored to ``namespace`` before this call is organised."""
        self._ask("flush", namespace, timeout_s=timeout_s)

    def _ask(self, kind: str, namespace: Namespaces | None, **fields: Any) -> Reply:
        job = self._core.search_job(kind, namespace, **fields)
        keys = self.keys
        with _redis_errors():
            pipe = self._blocking.pipeline(transaction=False)
            pipe.lpush(keys.search_queue(), pack(job))
            pipe.blpop([keys.reply(job.job_id)], timeout=max(job.deadline - time.time(), 0.01))
            raw = pipe.execute()[1]
        return self._core.parse_reply(raw, job)

    def get(self, note_id: str, *, namespace: str | None = None) -> Note:
        """The stored note with its links; NotFound when absent, tombstoned or not organised yet."""
        ns = self._core.namespace(namespace)
        v.check_id(note_id)
        with _redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            pipe.hgetall(self.keys.note(ns, note_id))
            pipe.zrange(self.keys.links(ns, note_id), 0, -1, withscores=True)
            fields, links = pipe.execute()
        return self._core.parse_note(ns, note_id, fields, links)

    def connected(
        self, note_id: str, *, namespace: str | None = None, max_hops: int = 2
    ) -> list[Neighbour]:
        """Notes reachable from ``note_id`` over links, breadth first, nearest first."""
        ns = self._core.namespace(namespace)
        v.check_id(note_id)
        v.check_int(max_hops, "max_hops", 1, 5)
        found: dict[str, tuple[int, str, float]] = {}
        frontier = [note_id]
        for hop in range(1, max_hops + 1):
            with _redis_errors():
                pipe = self._redis.pipeline(transaction=False)
                for nid in frontier:
                    pipe.zrange(self.keys.links(ns, nid), 0, -1, withscores=True, desc=True)
                rows = pipe.execute()
            frontier = _expand(found, note_id, frontier, rows, hop)
        with _redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for nid in found:
                pipe.hget(self.keys.note(ns, nid), "content")
            contents = pipe.execute()
        return _neighbours(found, contents)

    def stats(self, namespace: str | None = None) -> Stats:
        """Counts and organisation times for a namespace."""
        ns = self._core.namespace(namespace)
        keys = self.keys
        with _redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            pipe.zcard(keys.active(ns))
            pipe.zcard(keys.tombstoned(ns))
            pipe.xlen(keys.inbox(keys.shard_of(ns)))
            pipe.hgetall(keys.stats(ns))
            replies = pipe.execute()
        return self._core.parse_stats(ns, replies)

    def close(self) -> None:
        self._redis.close()
        self._blocking.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _expand(
    found: dict[str, tuple[int, str, float]],
    origin: str,
    frontier: list[str],
    rows: list[Any],
    hop: int,
) -> list[str]:
    nxt: list[str] = []
    for parent, links in zip(frontier, rows, strict=True):
        for raw, weight in links:
            nid = raw.decode()
            if nid != origin and nid not in found:
                found[nid] = (hop, parent, float(weight))
                nxt.append(nid)
    return nxt


def _neighbours(found: dict[str, tuple[int, str, float]], contents: list[Any]) -> list[Neighbour]:
    return [
        Neighbour(id=nid, hop=hop, via=via, weight=w, content=c.decode())
        for (nid, (hop, via, w)), c in zip(found.items(), contents, strict=True)
        if c is not None
    ]


class AsyncMemoryClient:
    """asyncio twin of MemoryClient: the same methods, awaitable."""

    def __init__(self, settings: ProducerSettings | None = None, **overrides: Any) -> None:
        self._core = _ClientCore(settings or ProducerSettings(**overrides))
        s = self._core.settings
        self.keys = self._core.keys
        self._redis = aioredis.Redis.from_url(
            s.redis_url, socket_timeout=s.socket_timeout_s, **_async_connect_kwargs(s)
        )
        self._blocking = aioredis.Redis.from_url(
            s.redis_url, socket_timeout=None, **_async_connect_kwargs(s)
        )
        self._enqueue = self._redis.register_script(ENQUEUE_LUA)

    @property
    def settings(self) -> ProducerSettings:
        return self._core.settings

    async def store(self, content: str, *, namespace: str | None = None, **fields: Any) -> str:
        ns = self._core.namespace(namespace)
        unknown = set(fields) - STORE_FIELDS
        if unknown:
            raise InvalidInput(f"unknown store() arguments {sorted(unknown)}")
        note_id, payload = self._core.store_payload(content, ns, **fields)
        await self._send(ns, [payload])
        return note_id

    async def store_many(
        self, items: Sequence[str | Mapping[str, Any]], *, namespace: str | None = None
    ) -> list[str]:
        ns = self._core.namespace(namespace)
        ids, payloads = self._core.store_many_payloads(items, ns)
        await self._send(ns, payloads)
        return ids

    async def delete(self, note_id: str, *, namespace: str | None = None) -> None:
        ns = self._core.namespace(namespace)
        await self._send(ns, [self._core.delete_payload(note_id, ns)])

    async def _send(self, ns: str, payloads: list[bytes]) -> None:
        inbox = self.keys.inbox(self.keys.shard_of(ns))
        with _redis_errors():
            await self._enqueue(keys=[inbox], args=[self.settings.max_pending, *payloads])

    async def search(
        self, query: str, *, namespace: Namespaces | None = None, **options: Any
    ) -> list[Hit]:
        return (await self._ask("search", namespace, query=query, **options)).hits

    async def context(
        self,
        query: str,
        *,
        namespace: Namespaces | None = None,
        max_tokens: int = 2000,
        **options: Any,
    ) -> str:
        reply = await self._ask("context", namespace, query=query, max_tokens=max_tokens, **options)
        return reply.text

    async def flush(self, namespace: str | None = None, timeout_s: float | None = None) -> None:
        await self._ask("flush", namespace, timeout_s=timeout_s)

    async def _ask(self, kind: str, namespace: Namespaces | None, **fields: Any) -> Reply:
        job = self._core.search_job(kind, namespace, **fields)
        keys = self.keys
        with _redis_errors():
            pipe = self._blocking.pipeline(transaction=False)
            pipe.lpush(keys.search_queue(), pack(job))
            pipe.blpop([keys.reply(job.job_id)], timeout=max(job.deadline - time.time(), 0.01))
            raw = (await pipe.execute())[1]
        return self._core.parse_reply(raw, job)

    async def get(self, note_id: str, *, namespace: str | None = None) -> Note:
        ns = self._core.namespace(namespace)
        v.check_id(note_id)
        with _redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            pipe.hgetall(self.keys.note(ns, note_id))
            pipe.zrange(self.keys.links(ns, note_id), 0, -1, withscores=True)
            fields, links = await pipe.execute()
        return self._core.parse_note(ns, note_id, fields, links)

    async def connected(
        self, note_id: str, *, namespace: str | None = None, max_hops: int = 2
    ) -> list[Neighbour]:
        ns = self._core.namespace(namespace)
        v.check_id(note_id)
        v.check_int(max_hops, "max_hops", 1, 5)
        found: dict[str, tuple[int, str, float]] = {}
        frontier = [note_id]
        for hop in range(1, max_hops + 1):
            with _redis_errors():
                pipe = self._redis.pipeline(transaction=False)
                for nid in frontier:
                    pipe.zrange(self.keys.links(ns, nid), 0, -1, withscores=True, desc=True)
                rows = await pipe.execute()
            frontier = _expand(found, note_id, frontier, rows, hop)
        with _redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for nid in found:
                pipe.hget(self.keys.note(ns, nid), "content")
            contents = await pipe.execute()
        return _neighbours(found, contents)

    async def stats(self, namespace: str | None = None) -> Stats:
        ns = self._core.namespace(namespace)
        keys = self.keys
        with _redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            pipe.zcard(keys.active(ns))
            pipe.zcard(keys.tombstoned(ns))
            pipe.xlen(keys.inbox(keys.shard_of(ns)))
            pipe.hgetall(keys.stats(ns))
            replies = await pipe.execute()
        return self._core.parse_stats(ns, replies)

    async def aclose(self) -> None:
        await self._redis.aclose()
        await self._blocking.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
