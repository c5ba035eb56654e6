"""Leases, the fenced commit (worker.lease) and the drain's time slice, against the real Redis."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from worker.context import WorkerContext
from worker.drain import others_waiting
from worker.lease import Lease, LeaseLost


def test_fenced_commit_applies_every_write_and_returns_raw_replies(redis_db: Redis) -> None:
    lease = Lease(redis_db, "t:lock", 10)
    assert lease.acquire()
    with lease.fenced() as pipe:
        pipe.hset("t:note", mapping={"a": 1, "b": 2.5, "c": b"\x00\xff"})
        pipe.zadd("t:links", {"n1": 0.25, "n2": 0.75})
        pipe.xadd("t:log", {"op": "add"})
        replies = pipe.execute()
    assert replies[:2] == [3, 2]
    assert isinstance(replies[2], bytes) and b"-" in replies[2]
    assert redis_db.hgetall("t:note") == {b"a": b"1", b"b": b"2.5", b"c": b"\x00\xff"}
    assert redis_db.zrange("t:links", 0, -1, withscores=True) == [(b"n1", 0.25), (b"n2", 0.75)]
    # the connection is in step afterwards: the next command reads its own reply
    assert redis_db.ping() is True
    lease.release()


def test_fenced_commit_raises_when_the_lease_moved_and_writes_nothing(redis_db: Redis) -> None:
    lease = Lease(redis_db, "t:lock", 10)
    assert lease.acquire()
    with pytest.raises(LeaseLost), lease.fenced() as pipe:
        redis_db.set("t:lock", b"someone-else")
        pipe.set("t:written", 1)
        pipe.execute()
    assert redis_db.exists("t:written") == 0
    assert not lease.held


def test_fenced_commit_refuses_a_lease_lost_before_it(redis_db: Redis) -> None:
    lease = Lease(redis_db, "t:lock", 10)
    assert lease.acquire()
    redis_db.delete("t:lock")
    with pytest.raises(LeaseLost), lease.fenced():
        pass


def test_fenced_commit_raises_the_first_command_error(redis_db: Redis) -> None:
    redis_db.set("t:string", "x")
    lease = Lease(redis_db, "t:lock", 10)
    assert lease.acquire()
    with pytest.raises(ResponseError, match="WRONGTYPE"), lease.fenced() as pipe:
        pipe.hset("t:string", "field", 1)
        pipe.set("t:other", 1)
        pipe.execute()
    assert redis_db.ping() is True
    lease.release()


def test_a_drain_yields_its_shard_only_when_another_drain_waits_for_a_worker(
    ctx: WorkerContext,
) -> None:
    r, keys = ctx.redis, ctx.keys
    assert not others_waiting(ctx, 0)
    r.set(keys.kicked(0), 1)  # its own kick does not count
    assert not others_waiting(ctx, 0)
    r.set(keys.kicked(1), 1)  # shard 1's drain is queued and no worker has taken it
    assert others_waiting(ctx, 0)
    r.set(keys.lease(1), b"worker-b")  # a worker took it
    assert not others_waiting(ctx, 0)


def test_a_kept_lease_outlives_a_step_longer_than_its_ttl(redis_db: Redis) -> None:
    lease = Lease(redis_db, "t:lock", 1.0)
    assert lease.acquire()
    with lease.kept():
        time.sleep(2.5)  # a slow batch: over twice the TTL
        with lease.fenced() as pipe:
            pipe.set("t:written", 1)
            pipe.execute()
    assert redis_db.get("t:written") == b"1"
    time.sleep(1.5)  # no longer kept: it expires
    with pytest.raises(LeaseLost), lease.fenced():
        pass
