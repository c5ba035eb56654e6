"""``AsyncMemoryClient``: ``MemoryClient``'s methods for asyncio, awaitable, on the same
protocol (one round trip per write; a search pushes its job and BLPOPs its reply)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from producer import proposals as rv
from producer import tracing
from producer import validation as v
from producer.client import WAIT_SLICE_S, blpop_timeout
from producer.connection import async_data_redis
from producer.core import (
    ENQUEUE_LUA,
    MAX_MERGE_HOPS,
    STORE_FIELDS,
    ClientCore,
    Namespaces,
    redis_errors,
    to_neighbours,
    to_vectors,
    walk_step,
)
from producer.errors import InvalidInput, NotFound
from producer.protocol import (
    Hit,
    Neighbour,
    Note,
    Organised,
    OrganiseJob,
    Proposal,
    Reply,
    SearchJob,
    Stats,
    pack,
)
from producer.settings import ProducerSettings, client_settings


class AsyncMemoryClient:
    """asyncio twin of MemoryClient: the same methods, awaitable."""

    def __init__(self, settings: ProducerSettings | None = None, **overrides: Any) -> None:
        self._core = ClientCore(client_settings(settings, overrides))
        s = self._core.settings
        self.keys = self._core.keys
        self._redis = async_data_redis(s, socket_timeout=s.socket_timeout_s)
        self._blocking = async_data_redis(s, socket_timeout=WAIT_SLICE_S + s.socket_timeout_s)
        self._enqueue = self._redis.register_script(ENQUEUE_LUA)
        self._review_lua = self._redis.register_script(rv.REVIEW_LUA)

    @property
    def settings(self) -> ProducerSettings:
        return self._core.settings

    async def store(self, content: str, *, namespace: str | None = None, **fields: Any) -> str:
        ns = self._core.namespace(namespace)
        unknown = set(fields) - STORE_FIELDS
        if unknown:
            raise InvalidInput(f"unknown store() arguments {sorted(unknown)}")
        with tracing.span("zettelq store", "PRODUCER", ns):
            note_id, payload = self._core.store_payload(
                content, ns, tracing.traceparent(), **fields
            )
            await self._send(ns, [payload], [note_id])
        return note_id

    async def store_many(
        self, items: Sequence[str | Mapping[str, Any]], *, namespace: str | None = None
    ) -> list[str]:
        ns = self._core.namespace(namespace)
        with tracing.span("zettelq store_many", "PRODUCER", ns):
            ids, payloads = self._core.store_many_payloads(items, ns)
            await self._send(ns, payloads, ids)
        return ids

    async def delete(self, note_id: str, *, namespace: str | None = None) -> None:
        ns = self._core.namespace(namespace)
        with tracing.span("zettelq delete", "PRODUCER", ns):
            await self._send(ns, [self._core.delete_payload(note_id, ns)], [note_id])

    async def _send(self, ns: str, payloads: list[bytes], ids: list[str]) -> None:
        inbox = self.keys.inbox(self.keys.shard_of(ns))
        args = [self.settings.max_pending, *payloads]
        with redis_errors():
            if not self.settings.wait_replicas:
                await self._enqueue(keys=[inbox], args=args)
                return
            acked = await self._replicated(inbox, args)
        self._core.replicated(acked, ids)

    async def _replicated(self, inbox: str, args: list[Any]) -> int:
        """The enqueue and a WAIT for ZQ_WAIT_REPLICAS in one round trip on one connection
        (WAIT counts the replicas that have that connection's writes); the count WAIT got."""
        for attempt in (0, 1):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.evalsha(self._enqueue.sha, 1, inbox, *args)
                pipe.wait(self.settings.wait_replicas, self._core.wait_ms)
                enqueued, acked = await pipe.execute(raise_on_error=False)
            if not isinstance(enqueued, NoScriptError) or attempt:
                break
            await self._redis.script_load(ENQUEUE_LUA)
        if isinstance(enqueued, Exception):
            raise enqueued
        return int(acked)

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

    async def embed(
        self,
        texts: Sequence[str],
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
    ) -> list[list[float]]:
        """The worker's embedding of each text (the vectors its notes get), in one round trip;
        ``namespace`` only routes the request (and signs it, when namespaces have keys)."""
        reply = await self._ask("embed", namespace, texts=texts, timeout_s=timeout_s)
        return to_vectors(reply)

    async def _ask(self, kind: str, namespace: Namespaces | None, **fields: Any) -> Reply:
        with tracing.span(f"zettelq {kind}", "CLIENT"):
            job = self._core.search_job(kind, namespace, **fields)
            queue = self.keys.search_queue_of(job.namespaces)
            return self._core.parse_reply(await self._request(queue, job), job)

    async def _request(self, queue: str, job: SearchJob | OrganiseJob) -> Any:
        reply_key = self.keys.reply(job.job_id)
        with redis_errors():
            pipe = self._blocking.pipeline(transaction=False)
            pipe.lpush(queue, pack(job))
            pipe.blpop([reply_key], timeout=blpop_timeout(job.deadline))
            raw = (await pipe.execute())[1]
            while raw is None and job.deadline > time.time():
                raw = await self._blocking.blpop([reply_key], timeout=blpop_timeout(job.deadline))
        return raw

    async def get(self, note_id: str, *, namespace: str | None = None) -> Note:
        ns = self._core.namespace(namespace)
        v.check_id(note_id)
        target: str | None = note_id
        for _ in range(MAX_MERGE_HOPS):
            if target is None:
                break
            with redis_errors():
                pipe = self._redis.pipeline(transaction=False)
                pipe.hgetall(self.keys.note(ns, target))
                pipe.hgetall(self.keys.links(ns, target))
                fields, links = await pipe.execute()
            target = self._core.merged_into(fields)
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
            with redis_errors():
                pipe = self._redis.pipeline(transaction=False)
                for nid in frontier:
                    pipe.hgetall(self.keys.links(ns, nid))
                rows = await pipe.execute()
            frontier = walk_step(found, note_id, frontier, rows, hop)
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for nid, (_, via, _) in found.items():
                pipe.hget(self.keys.note(ns, nid), "content")
                pipe.hget(self.keys.links(ns, via), nid)
            rows = await pipe.execute()
        return to_neighbours(found, rows[0::2], rows[1::2])

    async def stats(self, namespace: str | None = None) -> Stats:
        ns = self._core.namespace(namespace)
        keys = self.keys
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            pipe.zcard(keys.active(ns))
            pipe.zcard(keys.tombstoned(ns))
            pipe.xlen(keys.inbox(keys.shard_of(ns)))
            pipe.hgetall(keys.stats(ns))
            replies = await pipe.execute()
        return self._core.parse_stats(ns, replies)

    async def organise(
        self,
        namespace: str | None = None,
        *,
        wait: bool = True,
        timeout_s: float | None = None,
        jobs: Sequence[str] | None = None,
    ) -> Organised:
        job = self._core.organise_job(namespace, wait=wait, timeout_s=timeout_s, jobs=jobs)
        queue = self.keys.organise_queue()
        if not job.wait:
            with redis_errors():
                await self._redis.lpush(queue, pack(job))
            return self._core.organised(job, None)
        raw = await self._request(queue, job)
        return self._core.organised(job, self._core.parse_reply(raw, job))

    async def proposals(
        self, namespace: str | None = None, *, status: str | None = None, limit: int = 50
    ) -> list[Proposal]:
        ns = self._core.namespace(namespace)
        wanted = rv.statuses(status)
        v.check_int(limit, "limit", 1, rv.MAX_LIMIT)
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for name in wanted:
                pipe.zrevrange(self.keys.proposals(ns, name), 0, limit - 1, withscores=True)
            ids = rv.newest(await pipe.execute(), limit)
            pipe = self._redis.pipeline(transaction=False)
            for pid in ids:
                pipe.hgetall(self.keys.proposal(ns, pid))
            rows = await pipe.execute()
        return [rv.parse_proposal(ns, raw) for raw in rows if raw]

    async def accept(
        self, proposal_id: str, *, namespace: str | None = None, agent: str | None = None
    ) -> Proposal:
        return await self._review("accept", proposal_id, namespace, agent)

    async def reject(
        self, proposal_id: str, *, namespace: str | None = None, agent: str | None = None
    ) -> Proposal:
        return await self._review("reject", proposal_id, namespace, agent)

    async def revert(
        self, proposal_id: str, *, namespace: str | None = None, agent: str | None = None
    ) -> Proposal:
        return await self._review("revert", proposal_id, namespace, agent)

    async def _review(
        self, action: str, proposal_id: str, namespace: str | None, agent: str | None
    ) -> Proposal:
        ns = self._core.namespace(namespace)
        key = self.keys.proposal(ns, v.check_id(proposal_id))
        actor = v.check_agent(agent) or "unknown"
        deadline = time.monotonic() + self.settings.reply_timeout_s
        wait = rv.LOCKED_FIRST_WAIT_S
        while True:
            with redis_errors():
                raw = await self._redis.hgetall(key)
                if not raw:
                    raise NotFound(f"no proposal {proposal_id!r} in namespace {ns!r}")
                script_keys, args = rv.review_call(self.keys, ns, action, raw, actor, time.time())
                try:
                    reply = await self._review_lua(script_keys, args)
                    return rv.parse_proposal(ns, rv.pairs(reply))
                except ResponseError as exc:
                    rv.raise_review_error(exc)
            wait = rv.next_wait(wait, deadline, ns)
            await asyncio.sleep(wait)

    async def aclose(self) -> None:
        await self._redis.aclose()
        await self._blocking.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
