"""Fixtures of the fault-injection tests: a redis-server of the test's own, so that nothing
else sharing the developer's Redis (another test run's FLUSHDB) can disturb what they measure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_settings
from worker.context import WorkerContext
from worker.devserver import EmbeddedRedis
from worker.settings import WorkerSettings


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def own_settings(own_redis: EmbeddedRedis, tmp_path: Path) -> WorkerSettings:
    return make_settings(tmp_path, redis_url=own_redis.url)


@pytest.fixture
def own_ctx(own_settings: WorkerSettings) -> Iterator[WorkerContext]:
    context = WorkerContext.build(own_settings)
    yield context
    context.close()
