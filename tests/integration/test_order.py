"""Exactly once in effect, in stream order: whatever is redelivered, reclaimed or retried, the
state of an id is the effect of its last job in its shard stream. Driven through the worker's own
drain (worker.intake.drain) and dead-letter retry (worker.intake.deadletter), against the real
Redis."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from producer import MemoryClient
from tests.conftest import make_settings
from worker.context import WorkerContext
from worker.errors import LeaseLost
from worker.intake import drain as drain_module
from worker.intake.deadletter import retry_dead
from worker.intake.drain import GROUP, RawEntry, drain_shard
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace

NS = "order"
LEASE_S = 1.0
Process = Callable[[WorkerContext, int, list[RawEntry]], list[bytes]]


@pytest.fixture
def order_settings(redis_db: Redis, tmp_path: Path) -> WorkerSettings:
    return make_settings(tmp_path, lease_s=LEASE_S)


@pytest.fixture
def workers(order_settings: WorkerSettings) -> Iterator[tuple[WorkerContext, WorkerContext]]:
    """Two worker processes' contexts (two consumers of the shard streams)."""
    first, second = WorkerContext.build(order_settings), WorkerContext.build(order_settings)
    yield first, second
    first.close()
    second.close()


@pytest.fixture
def mem(order_settings: WorkerSettings) -> Iterator[MemoryClient]:
    with MemoryClient(order_settings) as c:
        yield c


def drain_until_empty(ctx: WorkerContext, ns: str = NS) -> int:
    """Drain the namespace's shard as long as it reports more work."""
    shard, total = ctx.keys.shard_of(ns), 0
    while True:
        result = drain_shard(ctx, shard)
        total += result.processed
        if not result.more:
            return total


def note(ctx: WorkerContext, nid: str, ns: str = NS) -> dict[bytes, bytes]:
    return ctx.redis.hgetall(ctx.keys.note(ns, nid))


def is_active(ctx: WorkerContext, nid: str, ns: str = NS) -> bool:
    return ctx.redis.zscore(ctx.keys.active(ns), nid) is not None


def audited(ctx: WorkerContext, nid: str, ns: str = NS) -> list[str]:
    """The ops of the audit entries of ``nid``, oldest first."""
    return [
        e[b"op"].decode()
        for _, e in ctx.redis.xrange(ctx.keys.audit(ns))
        if e[b"id"] == nid.encode()
    ]


def strand(monkeypatch: pytest.MonkeyPatch, ctx: WorkerContext, *, commit: bool) -> None:
    """Drain the namespace's shard with ``ctx`` as a worker that stops (is paused past its lease,
    or killed) in its first non-empty batch: after committing it (``commit``) or before. Its
    entries stay pending for it, unacknowledged; its lease is gone."""
    process: Process = drain_module._process

    def stop_in_batch(c: WorkerContext, shard: int, batch: list[RawEntry]) -> list[bytes]:
        if not batch:
            return process(c, shard, batch)
        if commit:
            process(c, shard, batch)
        raise LeaseLost("paused past its lease before acknowledging its batch")

    monkeypatch.setattr(drain_module, "_process", stop_in_batch)
    try:
        result = drain_shard(ctx, ctx.keys.shard_of(NS))
    finally:
        monkeypatch.setattr(drain_module, "_process", process)
    assert result.more
    pending = ctx.redis.xpending(ctx.keys.inbox(ctx.keys.shard_of(NS)), GROUP)
    assert pending["pending"] > 0, "the stopped worker's batch stays pending"


def test_a_redelivered_committed_batch_of_delete_then_store_keeps_the_store(
    workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[delete X, store X] committed, not acknowledged, then redelivered: the delete is older
    than what X reflects (the store), so it is a no-op, and so is the store."""
    first, second = workers
    nid = mem.store("The inverter firmware is 2.1.", namespace=NS)
    drain_until_empty(first)
    mem.delete(nid, namespace=NS)
    mem.store("The inverter firmware is 2.2.", namespace=NS, id=nid)
    strand(monkeypatch, first, commit=True)
    assert note(first, nid)[b"content"] == b"The inverter firmware is 2.2."
    time.sleep(LEASE_S + 0.1)  # the stopped worker's entries have been idle for its lease
    assert drain_until_empty(second) == 2
    assert is_active(second, nid)
    assert note(second, nid)[b"content"] == b"The inverter firmware is 2.2."
    assert mem.get(nid, namespace=NS).content == "The inverter firmware is 2.2."
    assert audited(second, nid) == ["create", "delete", "update"]


def test_a_redelivered_committed_delete_stays_a_delete(
    workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = workers
    nid = mem.store("The gateway polls every minute.", namespace=NS)
    mem.delete(nid, namespace=NS)
    strand(monkeypatch, first, commit=True)
    time.sleep(LEASE_S + 0.1)
    drain_until_empty(second)
    assert not is_active(second, nid)
    assert audited(second, nid) == ["create", "delete"]


def test_a_stranded_store_is_applied_before_the_later_delete(
    workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next drain starts as soon as the old holder's lease is gone; a delete queued after
    the stranded store must not be overtaken by it (the note would come back)."""
    first, second = workers
    nid = mem.store("The battery is at 80 percent.", namespace=NS)
    strand(monkeypatch, first, commit=False)
    mem.delete(nid, namespace=NS)
    drain_until_empty(second)
    time.sleep(LEASE_S + 0.1)  # whatever is reclaimed only once idle is reclaimed now
    drain_until_empty(second)
    assert not is_active(second, nid)
    assert note(second, nid).get(b"status") != b"active"


def test_a_stranded_delete_is_applied_before_the_later_store(
    workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = workers
    nid = mem.store("The meter reads 12 kWh.", namespace=NS)
    drain_until_empty(first)
    mem.delete(nid, namespace=NS)
    strand(monkeypatch, first, commit=False)
    mem.store("The meter reads 14 kWh.", namespace=NS, id=nid)
    drain_until_empty(second)
    time.sleep(LEASE_S + 0.1)
    drain_until_empty(second)
    assert is_active(second, nid)
    assert note(second, nid)[b"content"] == b"The meter reads 14 kWh."


def test_stranded_entries_are_applied_first_in_stream_order(
    workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update without importance keeps the importance of the store before it: only applying
    the two in stream order gives that (skipping the older one as stale would not)."""
    first, second = workers
    nid = mem.store("The roof array faces south.", namespace=NS, importance=0.9)
    strand(monkeypatch, first, commit=False)
    mem.store("The roof array faces south-west.", namespace=NS, id=nid)
    assert drain_until_empty(second) == 2  # at once: no waiting for the entries' idle time
    fields = note(second, nid)
    assert fields[b"content"] == b"The roof array faces south-west."
    assert float(fields[b"importance"]) == 0.9
    assert audited(second, nid) == ["create", "update"]


def test_entries_delivered_late_to_an_old_holder_are_applied_in_order(
    redis_db: Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused holder's blocking read is still served by Redis after its lease is gone: entries
    land in its pending list while the next holder drains. They are applied before the entries
    read after them."""
    settings = make_settings(tmp_path, lease_s=LEASE_S, batch_size=2)
    old, new = WorkerContext.build(settings), WorkerContext.build(settings)
    try:
        with MemoryClient(settings) as client:
            client.store("A note of the first batch.", namespace=NS)
            client.store("Another note of the first batch.", namespace=NS)
            nid = client.store("The heat pump runs at night.", namespace=NS, importance=0.9)
            client.store("The heat pump runs at night and noon.", namespace=NS, id=nid)
            client.store("A note read last.", namespace=NS)
        shard = new.keys.shard_of(NS)
        process: Process = drain_module._process
        late: list[int] = []

        def deliver_to_the_old_holder(c: WorkerContext, s: int, batch: list[RawEntry]) -> list:
            done = process(c, s, batch)
            if batch and not late:
                got = c.redis.xreadgroup(GROUP, old.consumer, {c.keys.inbox(s): ">"}, count=1)
                late.append(len(got[0][1]))
            return done

        monkeypatch.setattr(drain_module, "_process", deliver_to_the_old_holder)
        drain_until_empty(new)
        monkeypatch.setattr(drain_module, "_process", process)
        assert late == [1]
        time.sleep(LEASE_S + 0.1)
        drain_until_empty(new)
        fields = note(new, nid)
        assert fields[b"content"] == b"The heat pump runs at night and noon."
        assert float(fields[b"importance"]) == 0.9
        assert audited(new, nid) == ["create", "update"]
        assert new.redis.xlen(new.keys.inbox(shard)) == 0
    finally:
        old.close()
        new.close()


LONG = "The installer's long report on the roof array. " * 4  #: over the narrow worker's limit


@pytest.fixture
def narrow(order_settings: WorkerSettings) -> Iterator[WorkerContext]:
    """A worker whose content limit dead-letters LONG (the limit is raised before the retry)."""
    context = WorkerContext.build(order_settings.model_copy(update={"max_content_bytes": 64}))
    yield context
    context.close()


def test_a_retried_dead_job_does_not_overwrite_a_newer_update(
    narrow: WorkerContext, workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient
) -> None:
    wide, _ = workers
    nid = mem.store(LONG, namespace=NS)
    drain_until_empty(narrow)
    assert narrow.redis.xlen(narrow.keys.dead()) == 1
    mem.store("The short version.", namespace=NS, id=nid)
    drain_until_empty(narrow)
    assert retry_dead(wide) == 1
    drain_until_empty(wide)
    assert note(wide, nid)[b"content"] == b"The short version."
    assert audited(wide, nid) == ["create"]


def test_a_retried_dead_job_does_not_bring_back_a_deleted_note(
    narrow: WorkerContext, workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient
) -> None:
    wide, _ = workers
    stored = mem.store("A note stored, then updated too long, then deleted.", namespace=NS)
    mem.store(LONG, namespace=NS, id=stored)
    mem.delete(stored, namespace=NS)
    never = mem.store(LONG, namespace=NS)  # dead-lettered, then deleted before it ever was a note
    mem.delete(never, namespace=NS)
    drain_until_empty(narrow)
    assert narrow.redis.xlen(narrow.keys.dead()) == 2
    assert retry_dead(wide) == 2
    drain_until_empty(wide)
    assert not is_active(wide, stored)
    assert not is_active(wide, never)
    assert audited(wide, stored) == ["create", "delete"]
    assert audited(wide, never) == []


def test_a_retried_dead_job_is_applied_and_keeps_its_place_if_dead_lettered_again(
    narrow: WorkerContext, workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient
) -> None:
    wide, _ = workers
    nid = mem.store(LONG, namespace=NS)
    drain_until_empty(narrow)
    [(_, first)] = narrow.redis.xrange(narrow.keys.dead())
    assert retry_dead(narrow) == 1
    drain_until_empty(narrow)  # still too long for this worker: dead again
    [(_, again)] = narrow.redis.xrange(narrow.keys.dead())
    assert again[b"entry"] == first[b"entry"]  # judged by its original place in the stream
    assert retry_dead(wide) == 1
    drain_until_empty(wide)
    assert note(wide, nid)[b"content"] == LONG.encode()
    assert wide.redis.xlen(wide.keys.dead()) == 0


def test_a_note_stored_after_the_last_new_note_was_deleted_links_to_no_tombstone(
    workers: tuple[WorkerContext, WorkerContext], mem: MemoryClient
) -> None:
    """The sequence tail (the last new note) is deleted with its note: the next new note of the
    same episode has no sequence link to a tombstone (found by the real-process test)."""
    ctx, _ = workers
    first = mem.store("The first reading of the day.", namespace=NS, agent="logger")
    drain_until_empty(ctx)
    mem.delete(first, namespace=NS)
    drain_until_empty(ctx)
    mem.store("The second reading of the day.", namespace=NS, agent="logger")
    drain_until_empty(ctx)
    assert check_namespace(ctx, NS) == []
    assert ctx.redis.exists(ctx.keys.links(NS, first)) == 0
