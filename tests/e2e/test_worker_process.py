"""End to end: a real `zettelq worker` process (Celery prefork) organises and answers."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator

import msgpack
import pytest

from producer import MemoryClient
from tests.e2e.workers import spawn, stop, wait_until
from worker.context import WorkerContext
from worker.index.projection import snapshot_path
from worker.index.vector import VectorIndex
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e


@pytest.fixture
def worker(settings: WorkerSettings) -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn(settings)
    yield proc
    stop(proc)


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


def test_a_warm_shutdown_leaves_a_snapshot_the_restart_starts_from(settings):
    """SIGTERM to the main process (Celery's warm shutdown): the pool process saves its
    projections before it exits, long before ZQ_SNAPSHOT_EVERY_S, so the next worker can load
    them instead of rebuilding from Redis."""
    texts = [f"snapshot note {i} on a warm shutdown" for i in range(30)]
    proc = spawn(settings, ZQ_SNAPSHOT_EVERY_S="3600")
    try:
        with MemoryClient(settings) as mem:
            ids = mem.store_many(texts, namespace="snap")
            wait_until(lambda: mem.stats("snap").notes == 30)
        with WorkerContext.build(settings) as ctx:
            path = snapshot_path(ctx, "snap")
        assert not path.with_suffix(".meta").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        stop(proc)
    side = msgpack.unpackb(path.with_suffix(".meta").read_bytes(), strict_map_key=False)
    assert set(side["ids"].values()) == set(ids)
    assert len(VectorIndex.load(path)) == 30
