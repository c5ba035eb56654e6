"""zettelq on a master watched by three sentinels (tests/sentinel/conftest.py): a real worker
process whose data store and Celery broker both go through the sentinels, and a beat whose
schedule does; the master killed
(SIGKILL) under a stream of stores; ZQ_WAIT_REPLICAS holding store() until the replica has the
write."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from redis import Redis

from producer import AsyncMemoryClient, MemoryClient, NotReplicated, Unavailable, ZettelqError
from producer.errors import NotFound
from producer.keys import Keys
from tests.e2e.test_beat import BEAT_ENV, STARTUP_S
from tests.e2e.workers import running, stop, wait_until, worker_env
from tests.integration.test_store_search import SEED_000
from tests.sentinel.conftest import SENTINEL_ENV, LocalSentinel
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

#: what one store() may take at most while the master dies: every attempt (ZQ_REDIS_RETRIES + 1)
#: times out on the socket, with back-off between them, and a generous margin; a call past it
#: is a hang
HANG_S = 30.0


def test_a_worker_stores_organises_and_answers_through_the_sentinels(
    sentinel_settings: WorkerSettings,
) -> None:
    with running(sentinel_settings, **SENTINEL_ENV), MemoryClient(sentinel_settings) as mem:
        ids = mem.store_many(SEED_000)
        mem.flush(timeout_s=60)
        assert mem.stats().notes == len(SEED_000)
        assert mem.search(SEED_000[2], k=1)[0].id == ids[2]

        async def from_asyncio() -> str:
            async with AsyncMemoryClient(sentinel_settings) as amem:
                note = await amem.store("stored by the asyncio client through Sentinel")
                await amem.flush(timeout_s=60)
                return (await amem.get(note)).content

        assert asyncio.run(from_asyncio()).startswith("stored by the asyncio client")


def test_stores_end_in_an_id_or_a_typed_error_across_a_failover_and_the_worker_resumes(
    local_sentinel: LocalSentinel, failover_settings: WorkerSettings
) -> None:
    settings = failover_settings.model_copy(update={"socket_timeout_s": 2.0})
    acked: list[tuple[str, float]] = []  # (id, when)
    failed: list[ZettelqError] = []
    slowest = [0.0]
    stop = threading.Event()

    def store_loop() -> None:
        with MemoryClient(settings) as mem:
            n = 0
            while not stop.is_set():
                n += 1
                started = time.monotonic()
                try:
                    acked.append((mem.store(f"note {n} of a stream across a failover"), started))
                except ZettelqError as exc:
                    failed.append(exc)
                    time.sleep(0.05)
                slowest[0] = max(slowest[0], time.monotonic() - started)

    with running(settings, **SENTINEL_ENV), MemoryClient(settings) as mem:
        mem.store("the worker is up")
        mem.flush(timeout_s=60)
        writer = threading.Thread(target=store_loop, daemon=True)
        writer.start()
        wait_until(lambda: len(acked) >= 200, 30)
        killed_at = time.monotonic()
        local_sentinel.kill(local_sentinel.master_port)
        local_sentinel.wait_failover()
        promoted = len(acked)
        wait_until(lambda: len(acked) >= promoted + 200, 60)
        stop.set()
        writer.join(HANG_S)
        assert not writer.is_alive(), "a store() hung"
        assert slowest[0] < HANG_S
        mem.flush(timeout_s=120)
        lost = [note for note, _ in acked if not _present(mem, note)]
    assert failed, "the master's death reached no store() (the test killed nothing?)"
    assert all(isinstance(exc, ZettelqError) for exc in failed)
    after = [note for note, when in acked if when > killed_at]
    assert not set(lost) & set(after), "a store acknowledged by the new master was lost"
    print(f"\nacknowledged {len(acked)}, typed errors {len(failed)}, lost {len(lost)}")


def _present(mem: MemoryClient, note: str) -> bool:
    try:
        mem.get(note)
    except NotFound:
        return False
    return True


def test_wait_replicas_returns_once_the_replica_has_the_write_and_raises_when_it_cannot(
    shared_sentinel: LocalSentinel, sentinel_settings: WorkerSettings
) -> None:
    settings = sentinel_settings.model_copy(
        update={"wait_replicas": 1, "wait_replicas_timeout_s": 0.5}
    )
    replica = Redis(host="127.0.0.1", port=shared_sentinel.replica_port)
    with MemoryClient(settings) as mem:
        key = mem.keys.inbox(mem.keys.shard_of(settings.default_namespace))
        for n in range(1, 21):
            mem.store(f"replicated note {n}")
            assert replica.xlen(key) == n  # WAIT returned: the replica has it already
        mem.store_many(["a", "b"])
        mem.delete(mem.store("c"))
        assert replica.xlen(key) == 24

        async def confirmed() -> None:
            async with AsyncMemoryClient(settings) as amem:
                await amem.store("confirmed through the asyncio client")

        asyncio.run(confirmed())
        assert replica.xlen(key) == 25
        os.kill(shared_sentinel.procs[shared_sentinel.replica_port].pid, signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated) as caught:
                mem.store("no replica confirms this one", id="unconfirmed-1")
            assert caught.value.ids == ["unconfirmed-1"]
            assert "ZQ_WAIT_REPLICAS" in str(caught.value)

            async def from_asyncio() -> None:
                async with AsyncMemoryClient(settings) as amem:
                    with pytest.raises(NotReplicated):
                        await amem.store_many(["x", "y"])

            asyncio.run(from_asyncio())
        finally:
            os.kill(shared_sentinel.procs[shared_sentinel.replica_port].pid, signal.SIGCONT)
        wait_until(lambda: replica.xlen(key) == 28, 30)
        mem.store("confirmed again")
        assert replica.xlen(key) == 29


def test_a_beat_schedules_through_the_sentinels_onto_the_brokers_master(
    shared_sentinel: LocalSentinel, sentinel_settings: WorkerSettings
) -> None:
    env = {
        **worker_env(sentinel_settings),
        **BEAT_ENV,
        "ZQ_BROKER_URL": shared_sentinel.url(1),
        **SENTINEL_ENV,
    }
    beat = subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "beat", "--loglevel=WARNING"],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    broker = Redis(host="127.0.0.1", port=shared_sentinel.master_port, db=1)
    try:
        queue = f"{sentinel_settings.key_prefix}.maint"
        wait_until(lambda: broker.llen(queue) >= 2, STARTUP_S)  # kombu's sentinel transport
        assert broker.keys(f"{Keys(sentinel_settings.key_prefix).redbeat()}*")  # redbeat's
    finally:
        stop(beat)


def test_sentinels_asked_without_their_password_give_a_typed_error(
    sentinel_settings: WorkerSettings,
) -> None:
    settings = sentinel_settings.model_copy(update={"sentinel_password": None})
    with MemoryClient(settings) as mem, pytest.raises(Unavailable, match="No master found"):
        mem.store("the sentinels refuse to say where the master is")
