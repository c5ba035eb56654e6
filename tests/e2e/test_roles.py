"""Worker roles: ingest-only Celery workers (ZQ_SERVE_SEARCH=false) and search-only
`zettelq searcher` processes, each a real process against the real Redis."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from producer import MemoryClient, ReplyTimeout
from tests.e2e.workers import running, stop, wait_until, worker_env
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

NOTES = [
    "The billing service retries failed card payments three times",
    "Card payments that fail after three retries open a support ticket",
    "The office plants are watered on Mondays",
]


def _searcher(settings: WorkerSettings) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "searcher"],
        env=worker_env(settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_an_ingest_only_worker_organises_and_a_searcher_answers(settings: WorkerSettings):
    with MemoryClient(settings) as mem, running(settings, ZQ_SERVE_SEARCH="false"):
        ids = mem.store_many(NOTES, namespace="roles")
        wait_until(lambda: mem.stats("roles").notes == len(NOTES), timeout_s=60)
        assert mem.get(ids[0], namespace="roles").links  # organised: linked to its neighbour
        with pytest.raises(ReplyTimeout):  # nobody serves searches yet
            mem.search("card payments", namespace="roles", timeout_s=2)
        searcher = _searcher(settings)
        try:
            hits = mem.search("card payments", namespace="roles", k=2, timeout_s=30)
            assert {h.id for h in hits} == set(ids[:2])
            stored = mem.store("Refunds for failed card payments take five days", namespace="roles")
            hits = mem.search("refunds card payments", namespace="roles", k=1, timeout_s=30)
            assert hits[0].id == stored  # read-your-writes across the two roles
        finally:
            stop(searcher)
        with pytest.raises(ReplyTimeout):
            mem.search("card payments", namespace="roles", timeout_s=2)


@pytest.mark.parametrize("role", ["worker", "searcher"])
def test_a_serving_process_sets_its_gil_switch_interval(
    settings: WorkerSettings, tmp_path, role: str
):
    """ZQ_SWITCH_INTERVAL_MS reaches the process whose threads serve searches: a worker's pool
    process, or a searcher."""
    log = tmp_path / f"{role}.log"
    args = [role, "--loglevel=INFO"] if role == "worker" else [role]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", *args],
            env={**worker_env(settings), "ZQ_SWITCH_INTERVAL_MS": "0.25"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "switch interval 0.25 ms" in log.read_text(errors="replace"), 60)
    finally:
        stop(proc)
    lines = [line for line in log.read_text().splitlines() if "switch interval" in line]
    if role == "worker":  # logged by the pool process, not by the Celery main process
        served = re.search(r"process (\d+) serves: search threads=1,", lines[0])
        assert served is not None and int(served.group(1)) != proc.pid
