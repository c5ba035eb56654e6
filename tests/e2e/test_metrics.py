"""/metrics of a real `zettelq worker` under Celery's prefork pool (two pool processes) and of a
`zettelq searcher`: the metric names and types, counters that move after stores, a search and a
dead letter (counted in the pool's children, served by the main process), and the backlog
gauge that rises on a burst and returns to 0."""

from __future__ import annotations

import time
import urllib.request

import msgpack
import pytest

from producer import MemoryClient
from tests.e2e.workers import running, spawn_searcher, stop, wait_until
from worker.runtime.devserver import free_port
from worker.settings import WorkerSettings

prometheus_parser = pytest.importorskip(
    "prometheus_client.parser", reason="pip install -e '.[metrics]' to run this"
)

pytestmark = pytest.mark.e2e

NS = "metered"

TYPES = {
    "zettelq_jobs": "counter",
    "zettelq_dead_letters": "counter",
    "zettelq_ingest_batch_seconds": "histogram",
    "zettelq_ingest_batch_jobs": "histogram",
    "zettelq_search_seconds": "histogram",
    "zettelq_backlog_entries": "gauge",
    "zettelq_dead_letter_entries": "gauge",
    "zettelq_redis_up": "gauge",
    "zettelq_projection_notes": "gauge",
    "zettelq_projection_vector_bytes": "gauge",
}


def scrape(port: int) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """Each family by name: its type and its samples (by name and labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    families = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        samples = {(("", s.name), *sorted(s.labels.items())): s.value for s in family.samples}
        families[family.name] = (family.type, samples)
    return families


def value(families: dict, family: str, sample: str, **labels: str) -> float:
    return families[family][1].get((("", sample), *sorted(labels.items())), 0.0)


def backlog(families: dict) -> float:
    _, samples = families["zettelq_backlog_entries"]
    return sum(samples.values())


def test_a_prefork_worker_serves_every_process_metrics(settings: WorkerSettings) -> None:
    port = free_port()
    env = {"ZQ_METRICS_PORT": str(port), "ZQ_METRICS_DIR": str(settings.index_dir / "metrics")}
    with running(settings, **env), MemoryClient(settings) as mem:
        wait_until(lambda: _answers(port), 60)
        assert value(scrape(port), "zettelq_redis_up", "zettelq_redis_up") == 1
        for start in range(0, 3000, 1000):
            batch = range(start, start + 1000)
            mem.store_many([f"metered note {i} about solar panels" for i in batch], namespace=NS)
        burst = scrape(port)
        mem.flush(NS, timeout_s=120)
        assert mem.search("solar panels", namespace=NS)
        inbox = mem.keys.inbox(mem.keys.shard_of(NS))
        bad = {"v": 1, "op": "store", "id": "x", "ns": NS, "content": "", "created_at": 1.0}
        mem._redis.xadd(inbox, {"j": msgpack.packb(bad)})
        wait_until(lambda: mem.stats(NS).dead == 1, 30)
        time.sleep(0.2)
        after = scrape(port)
    for name, kind in TYPES.items():
        assert after[name][0] == kind, name
    assert backlog(burst) > 0, "the burst was organised before the scrape: raise its size"
    assert backlog(after) == 0
    assert value(after, "zettelq_jobs", "zettelq_jobs_total") >= 3001
    assert value(after, "zettelq_dead_letters", "zettelq_dead_letters_total") == 1
    assert value(after, "zettelq_dead_letter_entries", "zettelq_dead_letter_entries") == 1
    assert value(after, "zettelq_ingest_batch_jobs", "zettelq_ingest_batch_jobs_count") > 0
    assert value(after, "zettelq_projection_notes", "zettelq_projection_notes") >= 3000
    vector_bytes = value(
        after, "zettelq_projection_vector_bytes", "zettelq_projection_vector_bytes"
    )
    assert vector_bytes >= 3000 * 4
    searches = sum(
        v for (name, *labels), v in after["zettelq_search_seconds"][1].items()
        if name[1] == "zettelq_search_seconds_count"
    )  # fmt: skip
    assert searches >= 2  # the flush and the search
    for _, samples in after.values():  # no note id or namespace in any label
        assert not any(key in ("namespace", "ns", "id") for s in samples for key, _ in s[1:])


def test_a_searcher_serves_its_own_metrics(settings: WorkerSettings) -> None:
    port = free_port()
    proc = spawn_searcher(settings, ZQ_METRICS_PORT=str(port))
    try:
        wait_until(lambda: _answers(port), 60)
        with MemoryClient(settings) as mem:
            mem.flush(NS, timeout_s=30)
        # the search thread observes a request's duration after it has sent the reply
        wait_until(lambda: _flushes(scrape(port)) > 0, 10)
        families = scrape(port)
        assert _flushes(families) == 1
        assert families["zettelq_backlog_entries"][0] == "gauge"
    finally:
        stop(proc)


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def _flushes(families: dict) -> float:
    return value(families, "zettelq_search_seconds", "zettelq_search_seconds_count", kind="flush")
