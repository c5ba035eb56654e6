"""End to end: a real `zettelq worker` process (Celery prefork) organises and answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from producer import MemoryClient
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e


def worker_env(settings: WorkerSettings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "ZQ_REDIS_URL": settings.redis_url,
            "ZQ_KEY_PREFIX": settings.key_prefix,
            "ZQ_SHARD_COUNT": str(settings.shard_count),
            "ZQ_INDEX_DIR": str(settings.index_dir),
            "ZQ_LEASE_S": str(settings.lease_s),
            "ZQ_SWEEP_INTERVAL_S": "0.5",
        }
    )
    return env


def start_worker(settings: WorkerSettings, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "worker", "--loglevel=WARNING", *extra],
        env=worker_env(settings),
        stdout=subprocess.DEVNULL,
    )


def wait_until(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


@pytest.fixture
def worker(settings: WorkerSettings) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_worker(settings)
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_worker_process_organises_without_being_asked_and_answers(settings, worker):
    with MemoryClient(settings) as mem:
        ids = mem.store_many(
            [f"worker process note {i} about redis streams" for i in range(40)], namespace="e2e"
        )
        wait_until(lambda: mem.stats("e2e").pending == 0 and mem.stats("e2e").notes == 40)
        hits = mem.search("redis streams note 7", namespace="e2e", k=5)
        assert hits and set(h.id for h in hits) <= set(ids)
        assert mem.stats("e2e").links > 0
        mem.delete(ids[0], namespace="e2e")
        mem.flush("e2e")
        assert mem.stats("e2e").notes == 39
