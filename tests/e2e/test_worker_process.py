"""End to end: a real `zettelq worker` process (Celery prefork) organises and answers."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from producer import MemoryClient
from tests.e2e.workers import spawn, stop, wait_until
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
