"""The two stores' I/O: queueing a batch's writes, reading note hashes, registry and hits,
flushing what this store wrote before a read. The decisions are in ``mapping`` and ``query``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from langgraph.store.base import BaseStore, Op, PutOp, Result, SearchOp
from langgraph.store.base.batch import AsyncBatchedBaseStore
from redis.exceptions import NoScriptError

from producer.adapters.langgraph.mapping import (
    DEFAULT_FIELDS,
    ID_PREFIX,
    MAX_SEARCH_NAMESPACES,
    Writes,
    WriteTracker,
    covers,
)
from producer.adapters.langgraph.query import (
    NOTE_FIELDS,
    Read,
    Row,
    check_ops,
    get_result,
    list_result,
    plan_reads,
    scored_items,
    search_k,
    search_result,
    visible,
)
from producer.async_client import AsyncMemoryClient
from producer.client import MemoryClient
from producer.connection import async_data_redis, data_redis
from producer.core import ENQUEUE_LUA, ClientCore, redis_errors
from producer.protocol import Hit

__all__ = ["AsyncZettelqStore", "ZettelqStore"]

#: search filter that keeps insight notes (consolidation's) out of an item search
NOTES_ONLY = {"kind": "note"}


def raise_first(replies: list[Any]) -> None:
    """Raise the first error among a pipeline's replies as Redis sent it (the pipeline's own
    raise prefixes its message, which would hide BACKPRESSURE and NOSCRIPT from the mapping)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


class ZettelqStore(BaseStore):
    """A LangGraph ``BaseStore`` on a ``MemoryClient``: every put is queued fire-and-forget
    (a batch's puts in one round trip), reads see this store's earlier puts. ``abatch`` runs
    ``batch`` in a thread; ``AsyncZettelqStore`` is the native asyncio twin."""

    supports_ttl = False

    def __init__(
        self, client: MemoryClient, *, fields: Sequence[str] | None = None, agent: str | None = None
    ) -> None:
        super().__init__()
        s = client.settings
        self._client = client
        self._core = ClientCore(s)
        self._fields = list(fields or DEFAULT_FIELDS)
        self._redis = data_redis(s, socket_timeout=s.socket_timeout_s)
        self._enqueue = self._redis.register_script(ENQUEUE_LUA)
        self._tracker = WriteTracker(agent)

    def close(self) -> None:
        """Close this store's Redis connections (the client stays open)."""
        self._redis.close()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        todo = list(ops)
        check_ops(todo)
        reads = plan_reads(todo)
        results: list[Result] = [None] * len(todo)
        if reads.any:
            self._read(reads, results)
        writes = self._tracker.plan(
            [op for op in todo if isinstance(op, PutOp)], self._core, self._fields
        )
        if writes.payloads:
            self._write(writes)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def _write(self, writes: Writes) -> None:
        """One round trip: an EVALSHA of the enqueue script per shard stream, and an SADD of
        the namespaces this store has not registered yet (once more if Redis lost the script)."""
        commands = writes.commands(self._core, self._enqueue.sha, self._tracker)
        sent = False
        try:
            with redis_errors():
                try:
                    self._send(commands)
                except NoScriptError:
                    self._redis.script_load(ENQUEUE_LUA)
                    self._send(commands)
            sent = True
        finally:
            self._tracker.written(writes, sent=sent)

    def _send(self, commands: list[tuple[object, ...]]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        raise_first(pipe.execute(raise_on_error=False))

    def _read(self, reads: Read, results: list[Result]) -> None:
        names = self._registry() if reads.needs_registry else []
        for ns, seen in self._tracker.due(reads.touched(self._tracker.dirty())).items():
            self._client.flush(ns)
            self._tracker.flushed(ns, seen)
        if reads.gets:
            rows = self._rows([(ns, nid) for _, ns, nid in reads.gets])
            for (i, ns, nid), row, (_, gop) in zip(reads.gets, rows, reads.get_ops, strict=True):
                results[i] = get_result(gop, ns, nid, row)
        for i, op in reads.searches:
            results[i] = self._search(op, names)
        if reads.lists:
            live = self._live(names)
            for i, lop in reads.lists:
                results[i] = list_result(lop, live)

    def _registry(self) -> list[str]:
        with redis_errors():
            members = self._redis.smembers(self._core.keys.langgraph_namespaces())
        return visible(members, self._core.signing_keys)

    def _live(self, names: list[str]) -> list[str]:
        """The registered namespaces that hold at least one active note."""
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for ns in names:
                pipe.zcard(self._core.keys.active(ns))
            counts = pipe.execute()
        return [ns for ns, n in zip(names, counts, strict=True) if n]

    def _rows(self, refs: list[tuple[str, str]]) -> list[list[Any]]:
        keys = self._core.keys
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for ns, nid in refs:
                pipe.hmget(keys.note(ns, nid), NOTE_FIELDS)
            return list(pipe.execute())

    def _listing(self, names: list[str]) -> list[Row]:
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for ns in names:
                pipe.zrange(self._core.keys.active(ns), 0, -1)
            ids = pipe.execute()
        refs = [(ns, i.decode()) for ns, got in zip(names, ids, strict=True) for i in got]
        refs = [(ns, nid) for ns, nid in refs if nid.startswith(ID_PREFIX)]
        return [Row(ns, nid, row) for (ns, nid), row in zip(refs, self._rows(refs), strict=True)]

    def _search(self, op: SearchOp, names: list[str]) -> Result:
        wanted = [ns for ns in names if covers(op.namespace_prefix, ns)]
        if not wanted:
            return []
        hits: list[Hit] = []
        if op.query and op.query.strip():
            k = search_k(op, self._core.settings.max_k)
            for start in range(0, len(wanted), MAX_SEARCH_NAMESPACES):
                chunk = wanted[start : start + MAX_SEARCH_NAMESPACES]
                hits += self._client.search(op.query, namespace=chunk, k=k, filters=NOTES_ONLY)
        scored = scored_items(op, hits)
        full = len(scored) >= op.offset + op.limit
        return search_result(op, scored, [] if full else self._listing(wanted))


class AsyncZettelqStore(AsyncBatchedBaseStore):
    """The asyncio twin of ``ZettelqStore`` on an ``AsyncMemoryClient``. Create it inside the
    running event loop (LangGraph's AsyncBatchedBaseStore binds to it): concurrent ``aput``
    calls of one tick are sent as one batch, and sync calls from other threads run on that
    loop."""

    supports_ttl = False

    def __init__(
        self,
        client: AsyncMemoryClient,
        *,
        fields: Sequence[str] | None = None,
        agent: str | None = None,
    ) -> None:
        super().__init__()
        s = client.settings
        self._client = client
        self._core = ClientCore(s)
        self._fields = list(fields or DEFAULT_FIELDS)
        self._redis = async_data_redis(s, socket_timeout=s.socket_timeout_s)
        self._enqueue = self._redis.register_script(ENQUEUE_LUA)
        self._tracker = WriteTracker(agent)

    async def aclose(self) -> None:
        """Close this store's Redis connections (the client stays open)."""
        await self._redis.aclose()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        todo = list(ops)
        check_ops(todo)
        reads = plan_reads(todo)
        results: list[Result] = [None] * len(todo)
        if reads.any:
            await self._read(reads, results)
        writes = self._tracker.plan(
            [op for op in todo if isinstance(op, PutOp)], self._core, self._fields
        )
        if writes.payloads:
            await self._write(writes)
        return results

    async def _write(self, writes: Writes) -> None:
        commands = writes.commands(self._core, self._enqueue.sha, self._tracker)
        sent = False
        try:
            with redis_errors():
                try:
                    await self._send(commands)
                except NoScriptError:
                    await self._redis.script_load(ENQUEUE_LUA)
                    await self._send(commands)
            sent = True
        finally:
            self._tracker.written(writes, sent=sent)

    async def _send(self, commands: list[tuple[object, ...]]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        raise_first(await pipe.execute(raise_on_error=False))

    async def _read(self, reads: Read, results: list[Result]) -> None:
        names = await self._registry() if reads.needs_registry else []
        for ns, seen in self._tracker.due(reads.touched(self._tracker.dirty())).items():
            await self._client.flush(ns)
            self._tracker.flushed(ns, seen)
        if reads.gets:
            rows = await self._rows([(ns, nid) for _, ns, nid in reads.gets])
            for (i, ns, nid), row, (_, gop) in zip(reads.gets, rows, reads.get_ops, strict=True):
                results[i] = get_result(gop, ns, nid, row)
        for i, op in reads.searches:
            results[i] = await self._search(op, names)
        if reads.lists:
            live = await self._live(names)
            for i, lop in reads.lists:
                results[i] = list_result(lop, live)

    async def _registry(self) -> list[str]:
        with redis_errors():
            members = await self._redis.smembers(self._core.keys.langgraph_namespaces())
        return visible(members, self._core.signing_keys)

    async def _live(self, names: list[str]) -> list[str]:
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for ns in names:
                pipe.zcard(self._core.keys.active(ns))
            counts = await pipe.execute()
        return [ns for ns, n in zip(names, counts, strict=True) if n]

    async def _rows(self, refs: list[tuple[str, str]]) -> list[list[Any]]:
        keys = self._core.keys
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for ns, nid in refs:
                pipe.hmget(keys.note(ns, nid), NOTE_FIELDS)
            return list(await pipe.execute())

    async def _listing(self, names: list[str]) -> list[Row]:
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for ns in names:
                pipe.zrange(self._core.keys.active(ns), 0, -1)
            ids = await pipe.execute()
        refs = [(ns, i.decode()) for ns, got in zip(names, ids, strict=True) for i in got]
        refs = [(ns, nid) for ns, nid in refs if nid.startswith(ID_PREFIX)]
        rows = await self._rows(refs)
        return [Row(ns, nid, row) for (ns, nid), row in zip(refs, rows, strict=True)]

    async def _search(self, op: SearchOp, names: list[str]) -> Result:
        wanted = [ns for ns in names if covers(op.namespace_prefix, ns)]
        if not wanted:
            return []
        hits: list[Hit] = []
        if op.query and op.query.strip():
            k = search_k(op, self._core.settings.max_k)
            for start in range(0, len(wanted), MAX_SEARCH_NAMESPACES):
                chunk = wanted[start : start + MAX_SEARCH_NAMESPACES]
                hits += await self._client.search(
                    op.query, namespace=chunk, k=k, filters=NOTES_ONLY
                )
        scored = scored_items(op, hits)
        full = len(scored) >= op.offset + op.limit
        return search_result(op, scored, [] if full else await self._listing(wanted))
