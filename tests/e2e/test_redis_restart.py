"""Fault injection: the Redis server is killed and restarted (AOF, appendfsync everysec) while
producers store and search and a real worker organises.

Producers get a typed error within a bounded time (never a hang, never a silent drop), the
worker reconnects by itself, and every note whose store() returned is there afterwards.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis import Redis

from producer import MemoryClient, ReplyTimeout, Unavailable
from tests.conftest import make_settings
from tests.e2e.workers import running, wait_until
from worker.context import WorkerContext
from worker.runtime.devserver import EmbeddedRedis
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

NAMESPACES = ("restart-a", "restart-b")
SOCKET_TIMEOUT_S = 1.0
CALL_BOUND_S = 4.0  #: no call may take longer than this, outage or not


@dataclass
class Traffic:
    """What a producer thread saw: acknowledged ids, typed failures, the slowest call."""

    acked: dict[str, list[str]] = field(default_factory=lambda: {ns: [] for ns in NAMESPACES})
    unavailable: int = 0
    timeouts: int = 0
    searches_ok: int = 0
    slowest_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)


def _call(traffic: Traffic, fn, *args, **kwargs):
    started = time.monotonic()
    try:
        return fn(*args, **kwargs)
    except Unavailable:
        traffic.unavailable += 1
    except ReplyTimeout:
        traffic.timeouts += 1
    finally:
        traffic.slowest_s = max(traffic.slowest_s, time.monotonic() - started)
    return None


def _produce(mem: MemoryClient, traffic: Traffic) -> None:
    i = 0
    while not traffic.stop.is_set():
        ns = NAMESPACES[i % 2]
        nid = _call(traffic, mem.store, f"restart note {i} about topic {i % 13}", namespace=ns)
        if nid is not None:
            traffic.acked[ns].append(nid)
        if i % 10 == 0 and _call(traffic, mem.search, f"topic {i % 13}", namespace=ns, timeout_s=2):
            traffic.searches_ok += 1
        i += 1
        time.sleep(0.002)


def _kill(server: EmbeddedRedis) -> None:
    with Redis.from_url(server.url) as probe:
        pid = int(probe.info("server")["process_id"])
    os.kill(pid, signal.SIGKILL)
    server.stop()  # reaps the dead process; the data dir is ours and is kept


def test_redis_killed_and_restarted_loses_no_acknowledged_note(tmp_path: Path):
    data_dir = tmp_path / "redis"
    data_dir.mkdir()
    server = EmbeddedRedis(appendonly=True, data_dir=str(data_dir)).start()
    settings = make_settings(
        tmp_path, redis_url=server.url, socket_timeout_s=SOCKET_TIMEOUT_S, redis_retries=1
    )
    traffic = Traffic()
    try:
        with running(settings) as workers, MemoryClient(settings) as mem:
            producer = threading.Thread(target=_produce, args=(mem, traffic))
            producer.start()
            wait_until(lambda: traffic.searches_ok >= 3, timeout_s=30)
            _kill(server)
            time.sleep(1.5)
            down = traffic.unavailable
            server.start()  # same port, same AOF directory
            wait_until(lambda: traffic.searches_ok >= 6, timeout_s=30)
            time.sleep(1.0)
            traffic.stop.set()
            producer.join(30)
            late = mem.store_many([f"after the restart {i}" for i in range(50)], namespace="late")
            # organised by the reconnected dispatcher and drain tasks: nobody searches "late"
            wait_until(lambda: mem.stats("late").notes == len(late), timeout_s=30)
            for ns in NAMESPACES:
                mem.flush(ns, timeout_s=30)
            assert all(w.poll() is None for w in workers), "the worker must survive the outage"
            assert down > 0, "calls during the outage must fail with Unavailable"
            assert traffic.slowest_s < CALL_BOUND_S, f"a call hung {traffic.slowest_s:.1f}s"
            ctx = WorkerContext.build(settings)
            try:
                for ns in NAMESPACES:
                    acked = set(traffic.acked[ns])
                    stored = {m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)}
                    assert acked <= stored, f"{len(acked - stored)} acknowledged notes lost"
                    assert check_namespace(ctx, ns) == []
                    assert mem.stats(ns).pending == 0
            finally:
                ctx.close()
    finally:
        server.stop()


def test_a_frozen_redis_surfaces_as_unavailable_not_as_a_hang(tmp_path: Path):
    """A Redis that stops answering without closing connections (a network partition, a
    stopped host) must not hold a search for its whole timeout: the reply wait is sliced and
    the socket times out, so the caller gets Unavailable."""
    with EmbeddedRedis() as server:
        settings = make_settings(
            tmp_path, redis_url=server.url, socket_timeout_s=SOCKET_TIMEOUT_S, redis_retries=0
        )
        pid = int(Redis.from_url(server.url).info("server")["process_id"])
        with MemoryClient(settings) as mem:
            mem.store("a note stored before the freeze", namespace=NAMESPACES[0])
            with pytest.raises(ReplyTimeout):  # no worker: the wait itself is sliced
                mem.search("note", namespace=NAMESPACES[0], timeout_s=0.3)
            os.kill(pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    mem.search("note", namespace=NAMESPACES[0], timeout_s=120)
                waited = time.monotonic() - started
            finally:
                os.kill(pid, signal.SIGCONT)
    assert waited < 60, f"the search hung for {waited:.0f}s of its 120s timeout"
