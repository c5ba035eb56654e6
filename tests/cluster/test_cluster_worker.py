"""A real ``zettelq worker`` process on the cluster: its Celery broker is the session's plain
Redis, its data store the 3-master cluster (tests/cluster/conftest.py). Stores queue drains
through the dispatcher and Celery, searches and organise() are answered by its threads, and its
heartbeat is read back."""

from __future__ import annotations

import pytest

from producer import MemoryClient
from tests.conftest import session_redis_url
from tests.e2e.workers import running, wait_until
from tests.integration.test_store_search import SEED_000
from worker.connection import streams
from worker.context import WorkerContext
from worker.runtime.heartbeat import live_processes
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e


def test_a_worker_process_organises_answers_and_beats_on_the_cluster(cluster_settings, tmp_path):
    namespaces = [f"proc{i}" for i in range(4)]
    with (
        running(cluster_settings, ZQ_BROKER_URL=session_redis_url()),
        MemoryClient(cluster_settings) as mem,
    ):
        ids = {ns: mem.store_many(SEED_000, namespace=ns) for ns in namespaces}
        for ns in namespaces:
            wait_until(lambda ns=ns: mem.stats(ns).notes == len(SEED_000), 60)
        for ns in namespaces:
            assert mem.search(SEED_000[2], namespace=ns, k=1)[0].id == ids[ns][2]
        assert {h.namespace for h in mem.search(SEED_000[0], namespace=namespaces, k=20)} == set(
            namespaces
        )
        done = mem.organise(namespaces[0], jobs=["importance", "evict"])
        assert done.done and [r.job for r in done.runs] == ["importance", "evict"]
        with streams(cluster_settings) as st:
            wait_until(lambda: any(p.role == "worker" for p in live_processes(st.redis, st.keys)))
    ctx = WorkerContext.build(cluster_settings)
    try:
        for ns in namespaces:
            assert check_namespace(ctx, ns) == []
    finally:
        ctx.close()
