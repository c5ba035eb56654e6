"""worker.runtime.redis_config: the version check and the advice a worker logs about the Redis it
runs on, against real servers."""

from __future__ import annotations

import logging
import tempfile

import pytest
from redis import Redis

from worker.runtime.devserver import EmbeddedRedis
from worker.runtime.redis_config import (
    LISTPACK_VALUE,
    advice,
    check_at_start,
    describe,
    parse_version,
    require_supported,
)


def test_a_redis_configured_as_deploy_gets_no_advice_and_each_gap_gets_its_line() -> None:
    with (
        EmbeddedRedis(appendonly=True, data_dir=tempfile.mkdtemp()) as server,
        Redis.from_url(server.url) as r,
    ):
        (memory,) = advice(r)
        assert "noeviction but no maxmemory" in memory and "OutOfMemory" in memory
        r.config_set("maxmemory", "2gb")
        assert advice(r) == []  # with AOF and maxmemory it is configured as deploy/redis.conf
        r.config_set("hash-max-listpack-value", 64)  # Redis's default
        (line,) = advice(r)
        assert "64" in line and str(LISTPACK_VALUE) in line and "deploy/redis.conf" in line
        r.config_set("appendonly", "no")
        aof, listpack = advice(r)
        assert "appendonly no" in aof and "only copy" in aof
        assert listpack == line
        r.config_set("maxmemory-policy", "volatile-lfu")
        eviction, *_ = advice(r)
        assert "maxmemory-policy volatile-lfu" in eviction and "noeviction" in eviction


def test_a_throwaway_server_without_aof_is_not_asked_for_it() -> None:
    with EmbeddedRedis() as server, Redis.from_url(server.url) as r:
        assert r.config_get("appendonly") == {"appendonly": "no"}
        assert advice(r) == []  # its data dir goes when it stops: nothing to keep


def test_a_user_not_allowed_config_get_gets_no_advice_and_no_error() -> None:
    with EmbeddedRedis() as server, Redis.from_url(server.url) as admin:
        admin.acl_setuser("app", enabled=True, passwords=["+pw"], commands=["+@all", "-config"])
        with Redis.from_url(server.url, username="app", password="pw") as r:
            assert advice(r) == []


def test_the_servers_the_suite_runs_on_are_supported(redis_url: str) -> None:
    with Redis.from_url(redis_url) as r:
        require_supported(r)
        info = r.info("server")
    assert parse_version(info["redis_version"]) >= (7, 0)
    assert describe(info).startswith("Valkey " if "valkey_version" in info else "Redis ")


def test_an_evicting_policy_is_warned_about_once_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server,
        Redis.from_url(server.url) as r,
        caplog.at_level(logging.WARNING, logger="worker.runtime.redis_config"),
    ):
        check_at_start(r)
    (record,) = caplog.records
    assert "maxmemory-policy allkeys-lru" in record.message


def test_versions_compare_by_major_and_minor() -> None:
    assert parse_version("6.2.14") < (7, 0) <= parse_version("7.0.15") < parse_version("7.2.4")
    assert parse_version("10.0.0") > (7, 0)
    describe_valkey = describe({"redis_version": "7.2.4", "valkey_version": "9.1.2"})
    assert describe_valkey == "Valkey 9.1.2 (Redis 7.2.4)"
