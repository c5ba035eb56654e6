"""Fault injection: no worker, a stalled worker (SIGSTOP) and a full backlog.

store() never waits for a worker; search() raises ReplyTimeout within its timeout_s; a worker
that starts (or resumes) organises the backlog; past ZQ_MAX_PENDING, store() and store_many()
raise Backpressure, write nothing, and every acknowledged note is organised later.
"""

from __future__ import annotations

import signal
import time

import pytest

from producer import Backpressure, MemoryClient, ReplyTimeout
from tests.conftest import make_settings
from tests.e2e.workers import running, signal_group, wait_until
from worker.context import WorkerContext
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

TIMEOUT_S = 0.5
MARGIN_S = 0.25  #: what a ReplyTimeout may take beyond timeout_s (one round trip and a wake-up)


def _timed_out_search(mem: MemoryClient, ns: str) -> float:
    started = time.monotonic()
    with pytest.raises(ReplyTimeout):
        mem.search("backlog", namespace=ns, timeout_s=TIMEOUT_S)
    return time.monotonic() - started


def test_no_worker_then_stalled_worker_then_backlog_organised(own_settings, own_ctx: WorkerContext):
    with MemoryClient(own_settings) as mem:
        started = time.monotonic()
        ids = mem.store_many([f"backlog note {i} waiting" for i in range(200)], namespace="idle")
        ids.append(mem.store("one more backlog note", namespace="idle"))
        assert time.monotonic() - started < 1.0, "store() must not wait for a worker"
        assert TIMEOUT_S <= _timed_out_search(mem, "idle") < TIMEOUT_S + MARGIN_S
        with running(own_settings) as (worker,):
            wait_until(lambda: mem.stats("idle").notes == len(ids), timeout_s=30)
            signal_group(worker, signal.SIGSTOP)  # a worker that hangs mid-flight
            try:
                late = mem.store_many(
                    [f"stored while stalled {i}" for i in range(50)], namespace="idle"
                )
                assert TIMEOUT_S <= _timed_out_search(mem, "idle") < TIMEOUT_S + MARGIN_S
            finally:
                signal_group(worker, signal.SIGCONT)
            mem.flush("idle", timeout_s=30)
        assert mem.stats("idle").notes == len(ids) + len(late)
    assert check_namespace(own_ctx, "idle") == []


def test_backpressure_refuses_whole_calls_and_drops_nothing(tmp_path, own_redis):
    own_settings = make_settings(tmp_path, redis_url=own_redis.url, max_pending=100)
    acked: list[str] = []
    with MemoryClient(own_settings) as mem:
        while True:
            try:
                acked += mem.store_many(
                    [f"pressure {len(acked)} {i}" for i in range(7)], namespace="bp"
                )
            except Backpressure:
                break
        assert 100 - 7 < mem.stats("bp").pending == len(acked) <= 100
        with pytest.raises(Backpressure):
            mem.store_many(["all or nothing"] * 7, namespace="bp")
        assert mem.stats("bp").pending == len(acked), "a refused call writes nothing"
        while len(acked) < 100:
            acked.append(mem.store(f"single {len(acked)}", namespace="bp"))
        with pytest.raises(Backpressure, match="backlog over 100"):
            mem.store("one too many", namespace="bp")
        assert mem.stats("bp").pending == 100
        with running(own_settings):
            wait_until(lambda: mem.stats("bp").pending == 0, timeout_s=30)
            acked += mem.store_many(["room again"] * 3, namespace="bp")
            mem.flush("bp")
        ctx = WorkerContext.build(own_settings)
        try:
            stored = {m.decode() for m in ctx.redis.zrange(ctx.keys.active("bp"), 0, -1)}
            assert stored == set(acked)
            assert check_namespace(ctx, "bp") == []
        finally:
            ctx.close()
