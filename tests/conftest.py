"""Shared fixtures: a real Redis (DB 15 by default), settings under a per-test key prefix, an
in-thread search server running the real worker code, and clients."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from producer import MemoryClient
from worker.context import WorkerContext
from worker.drain import drain_shard
from worker.server import SearchServer
from worker.settings import WorkerSettings

REDIS_URL = os.environ.get("ZQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def redis_db() -> Iterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except RedisConnectionError:
        if os.environ.get("CI"):
            raise  # CI must have Redis; only a laptop may skip
        pytest.skip("no Redis at ZQ_TEST_REDIS_URL; run ./scripts/test, which starts one")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def settings(redis_db: Redis, tmp_path: Path) -> WorkerSettings:
    return make_settings(tmp_path)


def make_settings(tmp_path: Path, **overrides: object) -> WorkerSettings:
    values: dict[str, object] = {
        "redis_url": REDIS_URL,
        "key_prefix": f"t{uuid.uuid4().hex[:8]}",
        "shard_count": 2,
        "index_dir": tmp_path / "index",
        "batch_wait_ms": 0,
        "lease_s": 2.0,
        "reply_timeout_s": 10.0,
    }
    values.update(overrides)
    return WorkerSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def cli_env(settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    """The ZQ_ environment a ``zettelq`` command run in the test reads ``settings`` from."""
    for name in ("redis_url", "key_prefix", "shard_count", "index_dir"):
        monkeypatch.setenv(f"ZQ_{name.upper()}", str(getattr(settings, name)))
    return settings


@pytest.fixture
def ctx(settings: WorkerSettings) -> Iterator[WorkerContext]:
    context = WorkerContext.build(settings)
    yield context
    context.close()


@pytest.fixture
def server(ctx: WorkerContext) -> Iterator[SearchServer]:
    srv = SearchServer(ctx).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(settings: WorkerSettings) -> Iterator[MemoryClient]:
    with MemoryClient(settings) as c:
        yield c


def drain_all(ctx: WorkerContext) -> int:
    """Burst mode: organise everything queued on every shard, as a worker would."""
    return sum(drain_shard(ctx, shard).processed for shard in range(ctx.keys.shard_count))
