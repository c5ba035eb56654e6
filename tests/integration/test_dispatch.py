"""Queueing drains, against the real Redis: the dispatcher's kicks (worker.intake.dispatch), queued
for a shard with new entries only when no drain holds it, none lost when entries arrive as a drain
ends; and a drain's hand-over to another waiting shard when its time slice is up."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from producer import MemoryClient
from tests.conftest import make_settings
from worker.context import WorkerContext
from worker.intake import drain as drain_module
from worker.intake.dispatch import GROUP, kick, prune_consumers, sweep
from worker.intake.drain import SLICE_S, drain_shard, next_shard, run_drain
from worker.store.lease import Lease


def _sent() -> tuple[list[int], Callable[[int], None]]:
    """The shards a kick sends drains for, and the sender that records them."""
    sent: list[int] = []
    return sent, sent.append


def test_a_kick_queues_one_drain_for_an_idle_shard(ctx: WorkerContext) -> None:
    sent, send = _sent()
    assert kick(ctx.redis, ctx.keys, 0, 10, send)
    assert not kick(ctx.redis, ctx.keys, 0, 10, send)  # one is queued already
    assert sent == [0]
    assert ctx.redis.pttl(ctx.keys.kicked(0)) > 0  # a lost task cannot block the shard for ever


def test_a_kick_queues_nothing_while_a_drain_holds_the_shard(ctx: WorkerContext) -> None:
    sent, send = _sent()
    holder = Lease(ctx.redis, ctx.keys.lease(1), 10, owner="worker-b")
    assert holder.acquire()
    assert not kick(ctx.redis, ctx.keys, 1, 10, send)
    assert not ctx.redis.exists(ctx.keys.kicked(1))
    holder.release()
    assert kick(ctx.redis, ctx.keys, 1, 10, send)
    assert sent == [1]


def test_the_sweep_kicks_shards_with_a_backlog_and_no_drain(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    namespaces = {ctx.keys.shard_of(f"ns-{i}"): f"ns-{i}" for i in range(20)}
    assert set(namespaces) == {0, 1}
    for ns in namespaces.values():
        client.store("A note waiting in its shard.", namespace=ns)
    holder = Lease(ctx.redis, ctx.keys.lease(0), 10, owner="worker-b")
    assert holder.acquire()
    sent, send = _sent()
    assert sweep(ctx.redis, ctx.keys, 10, send) == [1]
    assert sweep(ctx.redis, ctx.keys, 10, send) == []  # shard 1's drain is queued already
    holder.release()
    assert sweep(ctx.redis, ctx.keys, 10, send) == [0]
    assert sent == [1, 0]


def test_entries_that_arrive_as_a_drain_ends_are_reported_for_another_drain(
    ctx: WorkerContext, client: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the lease check opens: a note lands after the drain's last read, while it still
    holds the lease (so the dispatcher queues nothing); the drain must say there is more."""
    ns = "racing"
    shard = ctx.keys.shard_of(ns)
    client.store("The first note, drained at once.", namespace=ns)
    release = Lease.release
    late: list[str] = []

    def store_then_release(lease: Lease) -> None:
        if lease.key == ctx.keys.lease(shard) and not late:
            _, send = _sent()
            late.append(client.store("A note stored just before the release.", namespace=ns))
            assert not kick(ctx.redis, ctx.keys, shard, 10, send)  # still held
        release(lease)

    monkeypatch.setattr(Lease, "release", store_then_release)
    first = drain_shard(ctx, shard)
    assert (first.processed, first.more) == (1, True)
    monkeypatch.setattr(Lease, "release", release)
    assert drain_shard(ctx, shard).processed == 1
    assert ctx.redis.zscore(ctx.keys.active(ns), late[0]) is not None


def _wait(ctx: WorkerContext, shard: int, waited_s: float) -> None:
    """Shard ``shard``'s drain has been queued for ``waited_s`` (its kick flag's TTL runs from
    ZQ_LEASE_S down)."""
    ttl_ms = int((ctx.settings.lease_s - waited_s) * 1000)
    ctx.redis.set(ctx.keys.kicked(shard), 1, px=ttl_ms)


@pytest.fixture
def four_shards(redis_db: Redis, tmp_path: Path) -> Iterator[WorkerContext]:
    context = WorkerContext.build(make_settings(tmp_path, shard_count=4, lease_s=60.0))
    yield context
    context.close()


def test_a_drain_hands_over_only_to_a_shard_whose_drain_waits_for_a_worker(
    four_shards: WorkerContext,
) -> None:
    ctx = four_shards
    assert next_shard(ctx, 0) is None
    _wait(ctx, 0, 1)  # its own kick does not count
    assert next_shard(ctx, 0) is None
    _wait(ctx, 1, 1)  # shard 1's drain is queued and no worker has taken it
    assert next_shard(ctx, 0) == 1
    ctx.redis.set(ctx.keys.lease(1), b"worker-b")  # a worker took it
    assert next_shard(ctx, 0) is None


def test_a_drain_hands_over_to_the_shard_it_drained_last_unless_another_waited_longer(
    four_shards: WorkerContext,
) -> None:
    ctx = four_shards
    ctx.redis.set(ctx.keys.drainer(2), ctx.consumer)
    ctx.redis.set(ctx.keys.drainer(3), "another-worker")
    _wait(ctx, 3, 3)
    _wait(ctx, 2, 1)
    assert next_shard(ctx, 0) == 2  # its projections of shard 2 are current
    _wait(ctx, 3, 1 + SLICE_S + 1)  # shard 3 has waited over a slice longer: its turn
    assert next_shard(ctx, 0) == 3
    _wait(ctx, 1, 20)  # and the longest wait goes first among the others
    assert next_shard(ctx, 0) == 1


def test_a_drain_task_goes_on_with_the_shard_it_hands_over_to(
    redis_db: Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no time slice, two shards with a backlog and a drain queued for the second, one task
    organises both, taking turns, and queues a drain for each shard it leaves with work."""
    ctx = WorkerContext.build(make_settings(tmp_path, batch_size=1))
    try:
        with MemoryClient(ctx.settings) as client:
            namespaces = {ctx.keys.shard_of(f"ns-{i}"): f"ns-{i}" for i in range(20)}
            ids = {
                ns: [client.store(f"Note {j} of {ns}.", namespace=ns) for j in range(3)]
                for ns in namespaces.values()
            }
        monkeypatch.setattr(drain_module, "SLICE_S", 0.0)
        _wait(ctx, 1, 0)
        sent, send = _sent()
        assert run_drain(ctx, 0, send) == 6
        assert set(sent) == {0, 1}
        for ns, note_ids in ids.items():
            active = {m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)}
            assert active == set(note_ids)
        assert ctx.redis.get(ctx.keys.drainer(1)) == ctx.consumer.encode()
    finally:
        ctx.close()


def test_entries_read_as_the_shard_lease_is_lost_are_reclaimed_by_the_next_drain(
    redis_db: Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch read in the round trip whose lease renewal fails stays pending for the drain
    that lost the lease; the next drain claims it once it has been idle for ZQ_LEASE_S, and
    every note is organised once."""
    settings = make_settings(tmp_path, batch_size=1, lease_s=1.0)
    first, second = WorkerContext.build(settings), WorkerContext.build(settings)
    try:
        with MemoryClient(settings) as client:
            ns = "handed"
            ids = [client.store(f"Note {i} of the shard.", namespace=ns) for i in range(3)]
        shard = first.keys.shard_of(ns)
        process = drain_module._process

        def lose_lease_after_the_first_batch(ctx: WorkerContext, s: int, batch: list) -> list:
            done = process(ctx, s, batch)
            if batch:  # it expired and worker b took it
                ctx.redis.set(ctx.keys.lease(s), b"worker-b/took-it", px=500)
            return done

        monkeypatch.setattr(drain_module, "_process", lose_lease_after_the_first_batch)
        lost = drain_shard(first, shard)
        assert (lost.processed, lost.more) == (1, True)
        pending = first.redis.xpending(first.keys.inbox(shard), drain_module.GROUP)
        assert pending["pending"] == 1  # the batch read with the failed renewal, still unacked
        monkeypatch.setattr(drain_module, "_process", process)
        assert drain_shard(second, shard).processed == 0  # b's lease still holds the shard
        time.sleep(1.1)  # b's lease expired; the pending entry has been idle for ZQ_LEASE_S
        organised = 0
        while True:
            result = drain_shard(second, shard)
            organised += result.processed
            if not result.more:
                break
        assert organised == 2
        active = {m.decode() for m in second.redis.zrange(second.keys.active(ns), 0, -1)}
        assert active == set(ids)
        creates = [
            e for _, e in second.redis.xrange(second.keys.audit(ns)) if e[b"op"] == b"create"
        ]
        assert len(creates) == 3
    finally:
        first.close()
        second.close()


def test_idle_group_members_holding_nothing_are_removed_and_pending_entries_kept(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    client.store_many(["one", "two"], namespace="members")
    key = ctx.keys.inbox(ctx.keys.shard_of("members"))
    ctx.redis.xgroup_create(key, GROUP, id="0", mkstream=True)
    ((_, done),) = ctx.redis.xreadgroup(GROUP, "gone-worker", {key: ">"}, count=1)
    ctx.redis.xack(key, GROUP, done[0][0])
    ctx.redis.xreadgroup(GROUP, "paused-worker", {key: ">"}, count=1)  # holds one entry
    time.sleep(0.05)
    assert prune_consumers(ctx.redis, ctx.keys, idle_s=0.01) == 1
    names = {m["name"] for m in ctx.redis.xinfo_consumers(key, GROUP)}
    assert names == {b"paused-worker"}
    assert ctx.redis.xpending(key, GROUP)["pending"] == 1  # still there to be reclaimed
    assert prune_consumers(ctx.redis, ctx.keys, idle_s=3600) == 0  # nobody idle that long
