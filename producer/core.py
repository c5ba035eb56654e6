"""The part of the clients that does no I/O of its own: validation, job building, reply and
note parsing, the enqueue script, error mapping and the Redis connection options both clients
(and the workers) use."""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    OutOfMemoryError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError

from producer import signing, tracing
from producer import validation as v
from producer.errors import (
    AccessDenied,
    Backpressure,
    InvalidInput,
    JobFailed,
    NotFound,
    NotReplicated,
    OutOfMemory,
    ReplyTimeout,
    ServerError,
    Unavailable,
    ZettelqError,
)
from producer.keys import Keys
from producer.protocol import (
    PROTOCOL_VERSION,
    DeleteJob,
    JobRun,
    Neighbour,
    Note,
    Organised,
    OrganiseJob,
    Reply,
    SearchJob,
    Stats,
    link_label,
    link_weight,
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
def redis_errors() -> Iterator[None]:
    try:
        yield
    except NoPermissionError as exc:
        if "script|load" in str(exc):
            raise Unavailable(
                "Redis does not hold zettelq's scripts and this user may not load them (its ACL"
                " denies SCRIPT LOAD, as it should for a tenant); a running worker loads them"
                f" within a second of starting or of a Redis restart ({exc})"
            ) from exc
        raise AccessDenied(
            f"Redis refused access ({exc}); check the user and password in ZQ_REDIS_URL"
            " and the user's ACL rules"
        ) from exc
    except (AuthenticationError, AuthorizationError) as exc:
        raise AccessDenied(
            f"Redis refused access ({exc}); check the user and password in ZQ_REDIS_URL"
            " and the user's ACL rules"
        ) from exc
    except MasterNotFoundError as exc:
        raise Unavailable(no_master(exc)) from exc
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise Unavailable(f"Redis unavailable: {exc}") from exc
    except OutOfMemoryError as exc:
        raise OutOfMemory(
            f"Redis is at its maxmemory and refused the write ({exc}); nothing was written"
        ) from exc
    except ResponseError as exc:
        if str(exc).startswith("NOAUTH"):
            raise AccessDenied(
                f"Redis requires a password ({exc}); put it in ZQ_REDIS_URL"
            ) from exc
        if str(exc).startswith("BACKPRESSURE"):
            raise Backpressure(str(exc)) from exc
        raise _response_error(exc) from exc


#: what each sentinel answered, in redis-py's MasterNotFoundError (after each client's repr)
SENTINEL_ANSWERS = re.compile(r"\)> - (.*?)(?=, <redis|$)")


def no_master(exc: MasterNotFoundError) -> str:
    """A MasterNotFoundError without the reprs of the sentinels' clients."""
    text = str(exc)
    answers = SENTINEL_ANSWERS.findall(text)
    why = f" (the sentinels answered: {', '.join(answers)})" if answers else ""
    return (
        f"Redis unavailable: {text.split(' : ', 1)[0]}{why}; a failover in progress, the"
        " sentinels of ZQ_REDIS_URL unreachable, or ZQ_SENTINEL_PASSWORD not theirs"
    )


#: the code of an error reply that says Redis cannot serve now -> what it means
NOT_NOW = {
    "BUSY": "Redis is busy running a script or function",
    "READONLY": "Redis is a read-only replica (a failover in progress, or ZQ_REDIS_URL names a"
    " replica)",
    "MISCONF": "Redis refuses writes because it cannot persist (check its disk and logs)",
    "MASTERDOWN": "the replica lost its primary",
    "TRYAGAIN": "Redis asks to retry",
}


def _response_error(exc: ResponseError) -> ZettelqError:
    """The typed error of an error reply that is not about access or backpressure. redis-py
    strips the code of the replies it has a class for (READONLY) and keeps it in the text of
    the others (BUSY, MISCONF, WRONGTYPE)."""
    text = str(exc)
    code = getattr(exc, "status_code", None) or text.split(" ", 1)[0]
    if code in NOT_NOW:
        return Unavailable(f"{NOT_NOW[code]}; retry later ({text})")
    return ServerError(f"Redis replied with an error: {text}")


class ClientCore:
    """Pure part of both clients: validates input, builds jobs, parses replies. No I/O."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self.keys = Keys.of(settings)
        self.signing_keys = {ns: k.get_secret_value() for ns, k in settings.namespace_keys.items()}

    def signed(self, job: dict[str, Any], namespaces: Sequence[str]) -> dict[str, Any]:
        """``job`` with its ``sig`` when this producer holds namespace keys (else unchanged)."""
        if self.signing_keys:
            job["sig"] = signing.sign(job, namespaces, self.signing_keys)
        return job

    def replicated(self, acked: int, ids: Sequence[str]) -> None:
        """NotReplicated unless WAIT's count ``acked`` reaches ZQ_WAIT_REPLICAS."""
        s = self.settings
        if acked < s.wait_replicas:
            raise NotReplicated(
                f"the write of {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''} reached the"
                f" master but only {acked} of the {s.wait_replicas} replicas ZQ_WAIT_REPLICAS asks"
                f" for within {s.wait_replicas_timeout_s}s, so a failover may lose it; write it"
                " again with the same id= (idempotent) once the replicas are back",
                list(ids),
            )

    @property
    def wait_ms(self) -> int:
        """WAIT's timeout in milliseconds (never 0, which would wait for ever)."""
        return max(1, round(self.settings.wait_replicas_timeout_s * 1000))

    def namespace(self, namespace: str | None) -> str:
        return v.check_namespace(namespace or self.settings.default_namespace)

    def store_payload(
        self, content: object, namespace: str, trace: str | None = None, /, **fields: Any
    ) -> tuple[str, bytes]:
        """The packed store job; ``trace`` is the traceparent it carries (producer/tracing.py)."""
        s = self.settings
        note_id = v.check_id(fields["id"]) if fields.get("id") is not None else new_id()
        job = {
            "v": PROTOCOL_VERSION,
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
        if trace is not None:
            job["tp"] = trace
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
        trace = tracing.traceparent()  # the call's span: one for every item
        for item in items:
            fields = {"content": item} if isinstance(item, str) else dict(item)
            unknown = set(fields) - STORE_FIELDS
            if unknown:
                raise InvalidInput(f"unknown item fields {sorted(unknown)}")
            content = fields.pop("content", None)
            note_id, payload = self.store_payload(content, namespace, trace, **fields)
            ids.append(note_id)
            payloads.append(payload)
        if len(set(ids)) != len(ids):
            raise InvalidInput("store_many items carry the same id twice")
        return ids, payloads

    def delete_payload(self, note_id: str, namespace: str) -> bytes:
        job = DeleteJob(
            id=v.check_id(note_id), ns=namespace, created_at=time.time(), tp=tracing.traceparent()
        )
        return pack(self.signed(job.model_dump(), [namespace]))

    def search_job(self, kind: str, namespace: Namespaces | None, **fields: Any) -> SearchJob:
        s = self.settings
        texts = self._texts(fields.pop("texts", None)) if kind == "embed" else []
        unknown = set(fields) - SEARCH_OPTIONS
        if unknown:
            raise InvalidInput(f"unknown search options {sorted(unknown)}")
        names = [namespace] if namespace is None or isinstance(namespace, str) else namespace
        if not isinstance(names, list | tuple) or not 0 < len(names) <= v.MAX_NAMESPACES:
            raise InvalidInput(f"namespace must be a str or a list of 1 to {v.MAX_NAMESPACES} str")
        timeout = fields.pop("timeout_s", None)
        timeout_s = v.check_timeout(s.reply_timeout_s if timeout is None else timeout)
        query = fields.pop("query", "")
        if kind in ("search", "context"):
            query = v.check_text(query, "query", s.max_content_bytes)
        job = SearchJob(
            job_id=new_id(),
            kind=kind,  # type: ignore[arg-type]
            namespaces=list(dict.fromkeys(self.namespace(n) for n in names)),
            query=query,
            texts=texts,
            k=v.check_int(fields.get("k", min(10, s.max_k)), "k", 1, s.max_k),
            hops=v.check_int(fields.get("hops", 1), "hops", 0, v.MAX_HOPS),
            filters=v.check_filters(fields.get("filters"), s),
            fresh=bool(fields.get("fresh", True)),
            reinforce=bool(fields.get("reinforce", True)),
            weights=v.check_weights(fields.get("weights")),
            as_of=v.check_time(fields.get("as_of"), "as_of"),
            diversity=v.check_unit_float(fields.get("diversity"), "diversity") or 0.0,
            min_relevance=v.check_unit_float(fields.get("min_relevance"), "min_relevance") or 0.0,
            max_tokens=v.check_int(
                fields.get("max_tokens", 2000),
                "max_tokens",
                v.MIN_CONTEXT_TOKENS,
                v.MAX_CONTEXT_TOKENS,
            ),
            deadline=time.time() + timeout_s,
            tp=tracing.traceparent(),
        )
        if not self.signing_keys:
            return job
        return job.model_copy(update={"sig": self.signed(job.model_dump(), job.namespaces)["sig"]})

    def _texts(self, texts: object) -> list[str]:
        """embed()'s texts: 1 to ``max_batch`` of them, each a valid note content."""
        s = self.settings
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidInput("texts must be a list of str")
        if not 0 < len(texts) <= s.max_batch:
            raise InvalidInput(f"embed takes 1 to {s.max_batch} texts (ZQ_MAX_BATCH)")
        return [v.check_text(t, "text", s.max_content_bytes) for t in texts]

    def organise_job(
        self, namespace: str | None, *, wait: bool, timeout_s: float | None, jobs: object
    ) -> OrganiseJob:
        timeout = self.settings.organise_timeout_s if timeout_s is None else timeout_s
        job = OrganiseJob(
            job_id=new_id(),
            namespace=self.namespace(namespace),
            jobs=v.check_job_names(jobs),
            wait=bool(wait),
            deadline=time.time() + v.check_timeout(timeout),
        )
        if not self.signing_keys:
            return job
        return job.model_copy(update={"sig": self.signed(job.model_dump(), [job.namespace])["sig"]})

    def organised(self, job: OrganiseJob, reply: Reply | None) -> Organised:
        runs = [] if reply is None else reply.runs
        return Organised(
            namespace=job.namespace, job_id=job.job_id, done=reply is not None, runs=runs
        )

    def parse_reply(self, raw: Any, job: SearchJob | OrganiseJob) -> Reply:
        if raw is None:
            raise ReplyTimeout(
                f"no reply to {job.kind} job_id={job.job_id} in time; is a worker running?"
            )
        reply = unpack(Reply, raw[1])
        if not reply.ok:
            raise JobFailed(reply.error or "unknown error")
        return reply

    def parse_note(self, namespace: str, note_id: str, fields: Any, links: Any) -> Note:
        """A note from its hash and its links hash (both read with HGETALL)."""
        if not fields or fields.get(b"status") != b"active":
            raise NotFound(f"no active note {note_id!r} in namespace {namespace!r}")
        weights = {k.decode(): link_weight(raw) for k, raw in links.items()}
        labels = {k.decode(): link_label(raw) for k, raw in links.items()}
        return note_from_hash(fields, weights, labels)

    def merged_into(self, fields: Any) -> str | None:
        """The survivor's id when this note hash is a near-duplicate merged away, else None."""
        if fields and fields.get(b"status") == b"tombstoned" and b"merged_into" in fields:
            return str(fields[b"merged_into"].decode())
        return None

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
            jobs=job_runs(counters),
            counters={
                k: int(v)
                for k, v in counters.items()
                if k in ORGANISATION_COUNTERS or k.startswith(ORGANISATION_PREFIXES)
            },
        )


#: Stats-hash counters that stats() reports in ``Stats.counters``.
ORGANISATION_COUNTERS = frozenset({"insights", "superseded", "merged", "links_capped"})
ORGANISATION_PREFIXES = ("llm_", "judge_", "construct_", "evolve_")


def to_vectors(reply: Reply) -> list[list[float]]:
    """The rows of an ``embed`` reply as lists of floats."""
    return [list(struct.unpack(f"<{len(row) // 4}f", row)) for row in reply.vectors]


def job_runs(counters: Mapping[str, str]) -> dict[str, JobRun]:
    """The last run of each periodic job from a namespace's stats fields run_/work_/took_<job>."""
    return {
        k[4:]: JobRun(
            job=k[4:],
            at=float(at),
            work=int(counters.get(f"work_{k[4:]}", 0)),
            seconds=float(counters.get(f"took_{k[4:]}", 0.0)),
        )
        for k, at in counters.items()
        if k.startswith("run_")
    }


MAX_MERGE_HOPS = 8  #: merged_into pointers get() follows (a survivor can be merged again)
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
        "reinforce",
        "timeout_s",
        "weights",
        "as_of",
        "diversity",
        "min_relevance",
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
        # RESP2 explicitly: redis-py 8 otherwise re-encodes every RESP3 reply into the RESP2
        # shape (a sorted-set score goes through format()), which doubled ZRANGE cost here
        "protocol": 2,
    }


def async_redis_kwargs(s: ProducerSettings) -> dict[str, Any]:
    return {**redis_kwargs(s), "retry": AsyncRetry(_backoff(), s.redis_retries)}


def walk_step(
    found: dict[str, tuple[int, str, float]],
    origin: str,
    frontier: list[str],
    rows: list[Any],
    hop: int,
) -> list[str]:
    """One breadth-first hop: ``rows`` are the links hashes (HGETALL) of ``frontier``; each
    parent's neighbours are taken strongest link first."""
    nxt: list[str] = []
    for parent, links in zip(frontier, rows, strict=True):
        weights = sorted(((link_weight(raw), nb) for nb, raw in links.items()), reverse=True)
        for weight, raw_id in weights:
            nid = raw_id.decode()
            if nid != origin and nid not in found:
                found[nid] = (hop, parent, weight)
                nxt.append(nid)
    return nxt


def to_neighbours(
    found: dict[str, tuple[int, str, float]], contents: list[Any], metas: list[Any] | None = None
) -> list[Neighbour]:
    labels = metas if metas is not None else [None] * len(found)
    return [
        Neighbour(id=nid, hop=hop, via=via, weight=w, content=c.decode(), label=link_label(m))
        for (nid, (hop, via, w)), c, m in zip(found.items(), contents, labels, strict=True)
        if c is not None
    ]
