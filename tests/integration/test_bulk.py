"""worker.store.bulk: raw-reply pipelines against the real Redis."""

from __future__ import annotations

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from worker.store.bulk import BulkPipeline, fields


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
