"""worker.bulk: raw-reply pipelines against the real Redis."""

from __future__ import annotations

import threading

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from worker.bulk import BulkPipeline, fields, pinned


def test_a_bulk_pipeline_returns_raw_replies_that_fields_decodes(redis_db: Redis) -> None:
    redis_db.hset("t:h", mapping={"a": "1", "b": b"\x00\xff"})
    pipe = BulkPipeline(redis_db)
    pipe.hmget("t:h", ["a", "missing", "b"])
    pipe.hgetall("t:h")
    pipe.hgetall("t:absent")
    hm, flat_hash, empty = pipe.execute()
    assert hm == [b"1", None, b"\x00\xff"]
    assert fields(flat_hash) == {b"a": b"1", b"b": b"\x00\xff"}
    assert fields(empty) == {}
    assert redis_db.ping() is True  # the connection is in step afterwards


def test_a_bulk_pipeline_reads_every_reply_then_raises_the_first_error(redis_db: Redis) -> None:
    redis_db.set("t:string", "x")
    pipe = BulkPipeline(redis_db)
    pipe.hgetall("t:string")
    pipe.set("t:after", 1)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        pipe.execute()
    assert redis_db.get("t:after") == b"1"  # not a transaction: the rest ran
    assert redis_db.get("t:string") == b"x"


def test_replies_spanning_many_socket_reads_come_back_whole_and_in_order(redis_db: Redis) -> None:
    """The replies are taken from the connection's hiredis reader as the socket fills it: a
    large value and thousands of small replies span many reads."""
    big = bytes(range(256)) * 2_000  # 512 KB: several reads of redis-py's 64 KB buffer
    redis_db.set("t:big", big)
    pipe = BulkPipeline(redis_db)
    for i in range(5_000):
        pipe.queue("SET", f"t:k{i}", i * "x")
        pipe.queue("GET", f"t:k{i}")
        pipe.queue("GET", "t:big" if i % 1_000 == 0 else "t:absent")
    pipe.queue("GET", "t:big")
    replies = pipe.execute()
    assert replies[-1] == big
    for i in range(5_000):
        ok, value, other = replies[3 * i : 3 * i + 3]
        assert ok == b"OK" and value == (i * "x").encode()
        assert other == (big if i % 1_000 == 0 else None)
    assert redis_db.ping() is True


def test_a_connection_lost_while_its_replies_are_read_is_dropped_not_reused(
    redis_db: Redis,
) -> None:
    """A pipeline whose connection Redis closes before all its replies arrive: the connection
    is dropped (its unread replies would answer the next commands), and the client goes on."""
    redis_db.set("t:x", "1")
    doomed = redis_db.client_id()  # the pooled connection the pipeline will use
    pipe = BulkPipeline(redis_db)
    pipe.queue("CLIENT", "KILL", "ID", doomed, "SKIPME", "no")
    pipe.queue("GET", "t:x")
    with pytest.raises(RedisError):  # the connection closed under it (no retry is configured)
        pipe.execute()
    assert redis_db.client_id() != doomed
    pipe = BulkPipeline(redis_db)
    pipe.queue("GET", "t:x")
    assert pipe.execute() == [b"1"]


def test_a_bulk_pipeline_reconnects_when_its_pooled_connection_was_closed(
    redis_db: Redis, redis_url: str
) -> None:
    """Redis closed the pooled connection between two pipelines (a restart, a timeout): the
    pool finds it closed when the next pipeline takes it, and the pipeline runs once on a new
    connection."""
    redis_db.set("t:x", "1")
    idle = redis_db.client_id()
    with Redis.from_url(redis_url) as other:
        other.client_kill_filter(_id=idle)
    pipe = BulkPipeline(redis_db)
    pipe.queue("INCR", "t:x")
    assert pipe.execute() == [2]
    assert redis_db.client_id() != idle


def client_id(r: Redis) -> int:
    pipe = BulkPipeline(r)
    pipe.queue("CLIENT", "ID")
    (got,) = pipe.execute()
    return int(got)


def test_a_pinned_threads_pipelines_share_one_connection_given_back_on_exit(
    redis_db: Redis,
) -> None:
    pool = redis_db.connection_pool
    with pinned(redis_db):
        first = client_id(redis_db)
        with pinned(redis_db):  # nested: the same connection, kept past the inner exit
            assert client_id(redis_db) == first
        assert client_id(redis_db) == first
        held = [c for c in pool._in_use_connections]
        assert len(held) == 1
        others: list[int] = []
        thread = threading.Thread(target=lambda: others.append(client_id(redis_db)))
        thread.start()
        thread.join()
        assert others and others[0] != first  # another thread takes one from the pool
    assert held[0] in pool._available_connections and not pool._in_use_connections


def test_pinned_connects_at_the_first_pipeline_not_on_entry() -> None:
    nowhere = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with pinned(nowhere):  # a search thread starting before Redis: nothing raised yet
        with pytest.raises(RedisConnectionError):
            client_id(nowhere)
    assert not nowhere.connection_pool._in_use_connections


def test_a_pinned_connection_redis_closed_is_opened_again_before_the_next_pipeline(
    redis_db: Redis, redis_url: str
) -> None:
    redis_db.set("t:x", "1")
    with pinned(redis_db):
        idle = client_id(redis_db)
        with Redis.from_url(redis_url) as other:
            other.client_kill_filter(_id=idle)
        pipe = BulkPipeline(redis_db)
        pipe.queue("INCR", "t:x")
        assert pipe.execute() == [2]  # once: the closed connection is found before sending
        assert client_id(redis_db) != idle
