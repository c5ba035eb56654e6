"""Fault injection: real `zettelq worker` processes, the shard's lease holder SIGSTOPped past its
lease (and then resumed) again and again while one producer stores, deletes and re-stores a few
hot ids; and Redis itself SIGSTOPped for seconds while the workers drain such jobs. Afterwards a
check that reads Redis directly finds every id in the state of its last job in stream order:
nothing acknowledged lost, nothing deleted brought back, no older version over a newer one."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from redis import Redis

from producer import MemoryClient
from tests.conftest import make_settings
from tests.e2e.workers import group_members, running, signal_group, wait_ready, wait_until
from worker.context import WorkerContext
from worker.runtime.devserver import EmbeddedRedis
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

NS = "hot"
#: the producer works on HOT ids at a time and moves on by one id every SHIFT_EVERY jobs, so
#: each id gets a few jobs in a short span (store, delete, re-store) and is then left as its
#: last job made it: a job applied twice or out of order shows in the final state
HOT = 6
SHIFT_EVERY = 4
OPS = 1_600  #: jobs the producer queues, one every OP_GAP_S
OP_GAP_S = 0.002
PAUSES = 5
LEASE_S = 1.0
PAUSE_S = 1.5 * LEASE_S  #: how long the lease holder stays stopped: its leases expire
#: small batches, so the holder is stopped with a batch in hand (read, maybe committed, not acked)
WORKER_ENV = {"ZQ_BATCH_SIZE": "8", "ZQ_BATCH_WAIT_MS": "20"}
FREEZES = 5
FREEZE_S = 2.0  #: over the lease and the workers' socket timeout (1 s)


def produce(
    settings: WorkerSettings,
    expected: dict[str, str | None],
    seed: int,
    jobs: range = range(OPS),
    gap_s: float = OP_GAP_S,
) -> None:
    """Store, delete and re-store hot ids from one client, so the stream holds the jobs in the
    order they were made; ``expected`` ends with each id's last job (its content, or None for a
    delete)."""
    rng = random.Random(seed)
    with MemoryClient(settings) as mem:
        for n in jobs:
            nid = f"hot-{n // SHIFT_EVERY + rng.randrange(HOT)}"
            if rng.random() < 0.3:
                mem.delete(nid, namespace=NS)
                expected[nid] = None
            else:
                content = f"Reading {n} of sensor {nid}: {rng.randint(0, 999)} watts."
                mem.store(content, namespace=NS, id=nid)
                expected[nid] = content
            time.sleep(gap_s)


def produce_until(
    settings: WorkerSettings,
    expected: dict[str, str | None],
    stop: threading.Event,
    finished: threading.Event,
    rounds: int = 10,
) -> None:
    """``produce`` round after round (OPS jobs each) until ``stop`` is set, at most ``rounds``
    times, so that jobs keep flowing for as long as the pauses take on a slow machine; then set
    ``finished``."""
    try:
        for n in range(rounds):
            produce(settings, expected, 16 + n, jobs=range(n * OPS, (n + 1) * OPS))
            if stop.is_set():
                return
    finally:
        finished.set()


class Holders:
    """Finds the worker process whose drain holds the shard lease, and stops it."""

    def __init__(self, r: Redis, settings: WorkerSettings, procs: list[subprocess.Popen[bytes]]):
        self.r = r
        self.lease = f"{settings.key_prefix}:{{s0}}:lease"
        self.audit = f"{settings.key_prefix}:{{{NS}}}:audit"
        self.by_pid = {pid: p for p in procs for pid in group_members(p.pid)}

    def current(self) -> subprocess.Popen[bytes] | None:
        token = self.r.get(self.lease)
        if token is None:
            return None
        pid = int(token.decode().split("/")[0].rsplit("-", 2)[1])  # <host>-<pid>-<hex>/<random>
        return self.by_pid.get(pid)

    def after_commit(self) -> subprocess.Popen[bytes] | None:
        """The holder, just after a commit of its landed (between its EXEC and its XACK)."""
        self.r.xread({self.audit: "$"}, block=1000)
        return self.current()

    def pause(self, done: threading.Event) -> int:
        """SIGSTOP the lease holder for PAUSE_S, PAUSES times while the producer runs: mostly
        just after a commit, every third time wherever it is; returns how many times."""
        paused = 0
        while paused < PAUSES and not done.is_set():
            proc = self.current() if paused % 3 == 2 else self.after_commit()
            if proc is None:
                time.sleep(0.005)
                continue
            signal_group(proc, signal.SIGSTOP)
            time.sleep(PAUSE_S)
            signal_group(proc, signal.SIGCONT)
            paused += 1
            time.sleep(0.3)
        return paused


def test_pausing_the_lease_holder_keeps_every_id_at_its_last_job(tmp_path: Path) -> None:
    with EmbeddedRedis() as server:
        settings = make_settings(tmp_path, redis_url=server.url, shard_count=1, lease_s=LEASE_S)
        r = Redis.from_url(settings.redis_url)
        expected: dict[str, str | None] = {}
        with running(settings, 2, **WORKER_ENV) as procs:
            wait_ready(settings, 2)
            paused_all, produced_all = threading.Event(), threading.Event()
            producer = threading.Thread(
                target=produce_until, args=(settings, expected, paused_all, produced_all)
            )
            producer.start()
            try:
                paused = Holders(r, settings, procs).pause(produced_all)
            finally:
                paused_all.set()
                producer.join()
            inbox = f"{settings.key_prefix}:{{s0}}:inbox"
            wait_until(lambda: r.xlen(inbox) == 0, timeout_s=60)
        assert paused == PAUSES
        check(r, settings, expected)
        r.close()


def check(r: Redis, settings: WorkerSettings, expected: dict[str, str | None]) -> None:
    """Every id in the state of its last job, no dead letter, and the namespace consistent."""
    assert r.xlen(f"{settings.key_prefix}:dead") == 0
    wrong = {nid: (want, state(r, settings, nid)) for nid, want in expected.items()}
    assert {nid: got for nid, got in wrong.items() if got[0] != got[1]} == {}
    ctx = WorkerContext.build(settings)
    try:
        assert check_namespace(ctx, NS) == []
    finally:
        ctx.close()


def test_freezing_redis_mid_batch_keeps_every_id_at_its_last_job(tmp_path: Path) -> None:
    """Redis SIGSTOPped for longer than the lease and the workers' socket timeout, just after a
    commit, FREEZES times while the workers drain a backlog of hot-id jobs: commits whose EXEC
    Redis applied while the worker saw a timeout, and leases that expired in the stall, are
    redelivered and taken over; every id still ends at its last job."""
    with EmbeddedRedis() as server:
        settings = make_settings(tmp_path, redis_url=server.url, shard_count=1, lease_s=LEASE_S)
        r = Redis.from_url(settings.redis_url)
        redis_pid = int(r.info("server")["process_id"])
        audit = f"{settings.key_prefix}:{{{NS}}}:audit"
        expected: dict[str, str | None] = {}
        env = {**WORKER_ENV, "ZQ_SOCKET_TIMEOUT_S": "1.0"}
        with running(settings, 2, **env):
            wait_ready(settings, 2)
            chunk = OPS // FREEZES
            for i in range(FREEZES):
                produce(settings, expected, 17, range(i * chunk, (i + 1) * chunk), 0.0)
                r.xread({audit: "$"}, block=2000)  # a commit just landed
                os.kill(redis_pid, signal.SIGSTOP)
                try:
                    time.sleep(FREEZE_S)
                finally:
                    os.kill(redis_pid, signal.SIGCONT)
            inbox = f"{settings.key_prefix}:{{s0}}:inbox"
            wait_until(lambda: r.xlen(inbox) == 0, timeout_s=60)
        check(r, settings, expected)
        r.close()


def state(r: Redis, settings: WorkerSettings, nid: str) -> str | None:
    """The id's state as Redis holds it: its content if it is an active note, else None."""
    fields = r.hgetall(f"{settings.key_prefix}:{{{NS}}}:note:{nid}")
    active = r.zscore(f"{settings.key_prefix}:{{{NS}}}:active", nid) is not None
    if fields.get(b"status") == b"active" and active:
        return fields[b"content"].decode()
    assert not active, f"{nid} is in the active set but its hash says {fields.get(b'status')}"
    return None
