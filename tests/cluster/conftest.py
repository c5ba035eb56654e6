"""A real 3-master Redis Cluster on loopback for the session: three ``redis-server
--cluster-enabled yes`` on free ports from 17000 up, joined by ``redis-cli --cluster create``,
torn down at the end. The tests' data store is the cluster; the broker and anything else that
must be a plain Redis stay on the session's single server (tests/conftest.py)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_settings, session_redis_url
from worker.runtime.devserver import ThrowawayCluster as LocalCluster
from worker.settings import WorkerSettings


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.skip("needs redis-server and redis-cli >= 7 on PATH (apt-get install redis-server)")
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster_settings(local_cluster: LocalCluster, tmp_path: Path) -> WorkerSettings:
    """Settings whose data store is the cluster (under a fresh key prefix) and whose broker is
    the session's plain Redis."""
    return make_settings(
        tmp_path,
        redis_url=local_cluster.url,
        broker_url=session_redis_url(),
        key_prefix=f"c{uuid.uuid4().hex[:8]}",
    )


@pytest.fixture
def settings(cluster_settings: WorkerSettings) -> WorkerSettings:
    """The cluster's settings under the name tests/conftest.py's ctx and server fixtures take."""
    return cluster_settings
