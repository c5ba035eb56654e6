"""worker.redis_config: the advice a worker logs about the Redis it runs on, against real
redis-servers."""

from __future__ import annotations

import tempfile

from redis import Redis

from worker.devserver import EmbeddedRedis
from worker.redis_config import LISTPACK_VALUE, advice


def test_a_redis_configured_as_deploy_gets_no_advice_and_each_gap_gets_its_line() -> None:
    with (
        EmbeddedRedis(appendonly=True, data_dir=tempfile.mkdtemp()) as server,
        Redis.from_url(server.url) as r,
    ):
        assert advice(r) == []  # the embedded Redis with AOF is configured as deploy/redis.conf
        r.config_set("hash-max-ziplist-value", 64)  # Redis's default
        (line,) = advice(r)
        assert "64" in line and str(LISTPACK_VALUE) in line and "deploy/redis.conf" in line
        r.config_set("appendonly", "no")
        aof, listpack = advice(r)
        assert "appendonly no" in aof and "only copy" in aof
        assert listpack == line


def test_a_user_not_allowed_config_get_gets_no_advice_and_no_error() -> None:
    with EmbeddedRedis() as server, Redis.from_url(server.url) as admin:
        admin.acl_setuser("app", enabled=True, passwords=["+pw"], commands=["+@all", "-config"])
        with Redis.from_url(server.url, username="app", password="pw") as r:
            assert advice(r) == []
