"""`zettelq health` against real `zettelq worker`, `searcher` and `beat` processes: it passes
while they run, fails at once after a clean stop (the heartbeat is deleted) and within the
heartbeat's TTL after a SIGKILL; a beat is healthy as leader and as standby."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
from redis import Redis

from producer.keys import Keys
from tests.e2e.test_beat import spawn_beat
from tests.e2e.workers import (
    kill_group,
    running,
    spawn_searcher,
    stop,
    wait_until,
    worker_env,
)
from worker.runtime.heartbeat import LIVE_S
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

HOST = socket.gethostname()
STARTUP_S = 120.0  #: how long processes may take to start on a loaded machine


def health(settings: WorkerSettings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli.main", "health", *args],
        env={**worker_env(settings), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def passes(settings: WorkerSettings, *args: str) -> bool:
    return health(settings, *args).returncode == 0


def live(settings: WorkerSettings, *args: str) -> list[dict[str, object]]:
    return json.loads(health(settings, "--json", *args).stdout)["processes"]


def assert_fails_with_one_line(result: subprocess.CompletedProcess[str], reason: str) -> None:
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("zettelq: unhealthy: ") and reason in result.stderr


def test_health_passes_while_a_worker_and_a_searcher_run_and_fails_at_once_after_they_stop(
    settings: WorkerSettings,
):
    assert_fails_with_one_line(health(settings), "no live zettelq process")
    searcher = spawn_searcher(settings)
    try:
        with running(settings, ZQ_SERVE_SEARCH="false") as [worker]:
            wait_until(lambda: passes(settings, "--role", "worker", "--host", HOST), STARTUP_S)
            wait_until(lambda: passes(settings, "--role", "searcher", "--host", HOST), STARTUP_S)
            rows = {row["role"]: row for row in live(settings)}
            assert {r: rows[r]["pid"] for r in rows} == {
                "worker": worker.pid,
                "searcher": searcher.pid,
            }
            assert rows["worker"]["host"] == HOST and rows["worker"]["version"]
            table = health(settings, "--role", "worker").stdout.splitlines()
            assert table[0].split()[:4] == ["ROLE", "HOST", "PID", "STATE"]
            assert table[1].split()[:4] == ["worker", HOST, str(worker.pid), "running"]
            assert_fails_with_one_line(
                health(settings, "--role", "worker", "--host", "elsewhere"), "on host elsewhere"
            )
        assert_fails_with_one_line(health(settings, "--role", "worker"), "no live worker")
        assert passes(settings, "--role", "searcher")
    finally:
        stop(searcher)
    assert_fails_with_one_line(health(settings, "--role", "searcher"), "no live searcher")


def test_a_killed_searchers_heartbeat_lapses_after_its_ttl(
    settings: WorkerSettings, redis_db: Redis
):
    searcher = spawn_searcher(settings)
    try:
        wait_until(lambda: passes(settings, "--role", "searcher"), STARTUP_S)
        [row] = live(settings, "--role", "searcher")
        key = Keys(settings.key_prefix).process(str(row["consumer"]))
        kill_group(searcher)
        killed = time.monotonic()
        assert redis_db.exists(key)  # nobody deleted it: it outlives the process until its TTL
        wait_until(lambda: not passes(settings, "--role", "searcher"), LIVE_S + 10)
        assert time.monotonic() - killed <= LIVE_S + 10
        assert not redis_db.exists(key)
    finally:
        stop(searcher)


def test_one_beat_leads_the_other_stands_by_and_both_are_healthy(settings: WorkerSettings):
    beats = [spawn_beat(settings), spawn_beat(settings)]
    try:
        wait_until(lambda: len(live(settings, "--role", "beat", "--host", HOST)) == 2, STARTUP_S)
        wait_until(
            lambda: (
                sorted(r["state"] for r in live(settings, "--role", "beat"))
                == ["leader", "standby"]
            ),
            STARTUP_S,
        )
        assert passes(settings, "--role", "beat", "--host", HOST)
        leader = next(r for r in live(settings, "--role", "beat") if r["state"] == "leader")
        first = next(b for b in beats if b.pid == leader["pid"])
        other = next(b for b in beats if b is not first)
        kill_group(first)  # its lock lapses after ZQ_BEAT_LOCK_S (4 s); the standby takes over
        wait_until(
            lambda: (
                [(r["pid"], r["state"]) for r in live(settings, "--role", "beat")]
                == [(other.pid, "leader")]
            ),
            STARTUP_S,
        )
        stop(other)
        assert_fails_with_one_line(health(settings, "--role", "beat"), "no live beat")
    finally:
        for beat in beats:
            stop(beat)


def test_a_dead_redis_fails_in_one_line_without_the_password(settings: WorkerSettings):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = health(settings, ZQ_REDIS_URL=f"redis://:s3cret@127.0.0.1:{port}/0")
    assert_fails_with_one_line(result, f"Redis at redis://:***@127.0.0.1:{port}/0 does not answer")
    assert "s3cret" not in result.stderr
