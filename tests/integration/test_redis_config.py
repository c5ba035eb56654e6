"""worker.redis_config: the advice a worker logs about the Redis it runs on, against real
redis-servers."""

from __future__ import annotations

from redis import Redis

from worker.devserver import EmbeddedRedis
from worker.redis_config import LISTPACK_VALUE, advice


def test_a_redis_with_the_default_listpack_bound_gets_advice_and_a_tuned_one_none() -> None:
    with EmbeddedRedis() as server, Redis.from_url(server.url) as r:
        assert advice(r) == []  # the embedded Redis is configured as deploy/redis.conf
        r.config_set("hash-max-ziplist-value", 64)  # Redis's default
        (line,) = advice(r)
        assert "64" in line and str(LISTPACK_VALUE) in line and "deploy/redis.conf" in line


def test_a_user_not_allowed_config_get_gets_no_advice_and_no_error() -> None:
    with EmbeddedRedis() as server, Redis.from_url(server.url) as admin:
        admin.acl_setuser("app", enabled=True, passwords=["+pw"], commands=["+@all", "-config"])
        with Redis.from_url(server.url, username="app", password="pw") as r:
            assert advice(r) == []
