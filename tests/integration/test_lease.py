"""Leases and the fenced commit (worker.store.lease), against the real Redis."""

from __future__ import annotations

import threading
import time

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from producer import MemoryClient
from tests.conftest import drain_all
from worker.context import WorkerContext
from worker.errors import LeaseLost
from worker.store.lease import Lease


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


def test_fenced_commit_renews_the_lease_inside_its_exec(redis_db: Redis) -> None:
    lease = Lease(redis_db, "t:lock", 10)
    assert lease.acquire()
    redis_db.pexpire("t:lock", 500)
    with lease.fenced() as pipe:
        pipe.set("t:written", 1)
        assert pipe.execute() == [b"OK"]  # only the caller's replies
    assert redis_db.pttl("t:lock") > 9_000
    assert redis_db.get("t:written") == b"1"


def test_a_lease_taken_and_released_in_callers_pipelines(redis_db: Redis) -> None:
    mine, theirs = Lease(redis_db, "t:lock", 10), Lease(redis_db, "t:lock", 10)
    pipe = redis_db.pipeline(transaction=False)
    mine.queue_acquire(pipe)
    pipe.get("t:lock")
    taken, seen = pipe.execute()
    assert mine.acquired(taken) and seen == mine.token

    pipe = redis_db.pipeline(transaction=False)
    theirs.queue_acquire(pipe)
    assert not theirs.acquired(pipe.execute()[0])

    pipe = redis_db.pipeline(transaction=False)
    pipe.set("t:stats", 1)
    mine.release(pipe)  # runs the caller's commands with the release
    assert not mine.held and redis_db.get("t:stats") == b"1"
    assert redis_db.exists("t:lock") == 0


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


def test_an_ingest_waits_for_the_namespace_lock_and_reads_what_its_holder_wrote(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    nid = client.store("The inverters push readings over MQTT.", namespace="held")
    holder = Lease(ctx.redis, ctx.keys.lock("held"), ctx.settings.lease_s, owner="holder")
    assert holder.acquire()
    drained: list[int] = []
    thread = threading.Thread(target=lambda: drained.append(drain_all(ctx)))
    thread.start()
    time.sleep(0.3)
    assert client.stats("held").notes == 0  # the drain's first read did not take the lock
    ctx.redis.incrby(ctx.keys.seq("held"), 5)  # the holder gives out seqs 1-5 meanwhile
    holder.release()
    thread.join(30)

    assert drained == [1]
    assert int(ctx.redis.hget(ctx.keys.note("held", nid), "seq")) == 6
    assert int(ctx.redis.get(ctx.keys.seq("held"))) == 6
