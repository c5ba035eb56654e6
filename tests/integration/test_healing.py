"""Worker threads heal: an error reply (OOM, BUSY, READONLY, WRONGTYPE at a planted reply key)
or a bug in one step does not end a search, organise, dispatch or heartbeat thread; it backs
off, logs once and serves again once Redis recovers. Producers get typed errors for the same
replies. The faults are real: a server of the test's own at its maxmemory, busy in a script, or
made a replica."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from producer import MemoryClient, OutOfMemory, ServerError, Unavailable
from producer.core import redis_errors
from producer.protocol import Reply, pack, unpack
from tests.conftest import drain_all
from worker import daemon
from worker.cli.health import verdict
from worker.context import WorkerContext
from worker.daemon import Daemon
from worker.intake.dispatch import Dispatcher
from worker.runtime.devserver import EmbeddedRedis
from worker.runtime.heartbeat import ProcessHeartbeat
from worker.runtime.organiser import OrganiseServer
from worker.runtime.servers import SearchServer, send_reply
from worker.settings import WorkerSettings

NS = "heal"


@pytest.fixture
def admin(own_redis: EmbeddedRedis) -> Iterator[Redis]:
    with Redis.from_url(own_redis.url) as r:
        yield r


def errors_of(d: Daemon) -> set[str]:
    return {kind for watch in d.watches.values() for kind in watch.errors}


def wait_for(condition: object, timeout_s: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def stored_and_found(client: MemoryClient, ctx: WorkerContext, text: str) -> bool:
    note_id = client.store(text, namespace=NS)
    drain_all(ctx)
    return note_id in [h.id for h in client.search(text, namespace=NS, k=5)]


def test_search_thread_survives_oom_at_its_reply_and_serves_after(
    own_settings: WorkerSettings, own_ctx: WorkerContext, admin: Redis
) -> None:
    with MemoryClient(own_settings) as client:
        first = SearchServer(own_ctx).start()
        try:
            assert stored_and_found(client, own_ctx, "the lighthouse keeper paints the rail")
        finally:
            first.stop()
        job = client._core.search_job("search", NS, query="lighthouse", k=3)
        admin.lpush(own_ctx.keys.search_queue_of([NS]), pack(job))  # waits for a server
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        with pytest.raises(OutOfMemory):
            client.store("refused while Redis is full", namespace=NS)
        server = SearchServer(own_ctx).start()
        try:
            wait_for(lambda: "OutOfMemoryError" in errors_of(server))
            admin.config_set("maxmemory", 0)
            assert stored_and_found(client, own_ctx, "the keeper climbs the stairs at dawn")
            assert server.problems() == []
        finally:
            server.stop()


def test_threads_survive_a_busy_script_and_producers_get_unavailable(
    own_redis: EmbeddedRedis, own_settings: WorkerSettings, own_ctx: WorkerContext, admin: Redis
) -> None:
    kicked: list[int] = []
    server = SearchServer(own_ctx).start()
    organiser = OrganiseServer(own_ctx).start()
    dispatcher = Dispatcher(own_settings, kicked.append).start()
    admin.config_set("busy-reply-threshold", 100)
    script = threading.Thread(target=_busy_loop, args=(own_redis.url,), daemon=True)
    try:
        script.start()
        with MemoryClient(own_settings) as client:
            wait_for(lambda: _is_busy(own_redis.url))
            with pytest.raises(Unavailable, match="busy running a script"):
                client.store("refused while Redis is busy", namespace=NS)
            wait_for(lambda: "ResponseError" in errors_of(server))
            wait_for(lambda: "ResponseError" in errors_of(dispatcher))
            admin.script_kill()
            script.join(10)
            client.store("queued once the script ended", namespace=NS)
            wait_for(lambda: bool(kicked))
            assert stored_and_found(client, own_ctx, "a busy script ended and search came back")
            assert client.organise(NS, wait=True).runs
            assert not server.problems() + organiser.problems() + dispatcher.problems()
    finally:
        for d in (server, organiser, dispatcher):
            d.stop()


def _busy_loop(url: str) -> None:
    with Redis.from_url(url, socket_timeout=60, retry=None) as r:
        try:
            r.eval("while true do end", 0)
        except ResponseError as exc:  # SCRIPT KILL ends it
            assert "killed" in str(exc)


def _is_busy(url: str) -> bool:
    with Redis.from_url(url) as r:
        try:
            r.ping()
        except ResponseError as exc:
            return str(exc).startswith("BUSY")
    return False


def test_threads_survive_a_failover_to_read_only_and_heal_after_promotion(
    own_settings: WorkerSettings, own_ctx: WorkerContext, admin: Redis
) -> None:
    server = SearchServer(own_ctx).start()
    try:
        with EmbeddedRedis() as primary, MemoryClient(own_settings) as client:
            admin.replicaof(primary.host, primary.port)
            with pytest.raises(Unavailable, match="read-only replica"):
                client.store("refused by a replica", namespace=NS)
            wait_for(lambda: "ReadOnlyError" in errors_of(server))
            admin.replicaof("NO", "ONE")
            assert stored_and_found(client, own_ctx, "promoted again, the replica takes writes")
    finally:
        server.stop()


def test_a_planted_key_at_a_reply_key_fails_that_job_only(
    settings: WorkerSettings, ctx: WorkerContext, server: SearchServer, client: MemoryClient
) -> None:
    organiser = OrganiseServer(ctx).start()
    try:
        search = client._core.search_job("search", NS, query="anything", k=3)
        organise = client._core.organise_job(NS, wait=True, timeout_s=5, jobs=None)
        for job, queue in (
            (search, ctx.keys.search_queue_of([NS])),
            (organise, ctx.keys.organise_queue()),
        ):
            ctx.redis.xadd(ctx.keys.reply(job.job_id), {"planted": 1})
            ctx.redis.lpush(queue, pack(job))
            wait_for(lambda q=queue: ctx.redis.llen(q) == 0)  # type: ignore[misc]
        assert stored_and_found(client, ctx, "the worker shrugged off a planted stream")
        assert client.organise(NS, wait=True).runs
        assert not server.problems() + organiser.problems()
        assert ctx.redis.type(ctx.keys.reply(search.job_id)) == b"stream"
    finally:
        organiser.stop()


def test_a_reply_that_cannot_be_packed_becomes_a_failed_reply(ctx: WorkerContext) -> None:
    unpackable = Reply.model_construct(job_id="j-unpackable", ok=True, error=object())
    pipe = ctx.redis.pipeline(transaction=False)
    send_reply(ctx, pipe, unpackable)
    pipe.execute()
    raw = ctx.redis.lpop(ctx.keys.reply("j-unpackable"))
    assert isinstance(raw, bytes)
    reply = unpack(Reply, raw)
    assert not reply.ok
    assert reply.error is not None and "could not be packed" in reply.error


def test_producer_errors_are_typed(client: MemoryClient, ctx: WorkerContext) -> None:
    note_id = client.store("a note whose hash a tenant replaced", namespace=NS)
    drain_all(ctx)
    key = ctx.keys.note(NS, note_id)
    ctx.redis.delete(key)
    ctx.redis.xadd(key, {"planted": 1})
    with pytest.raises(ServerError, match="WRONGTYPE"):
        client.get(note_id, namespace=NS)
    with pytest.raises(Unavailable, match="cannot persist"), redis_errors():
        raise ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's failing")


class Flaky(Daemon):
    """Fails ``failures`` times (a bug, not Redis), then succeeds."""

    thread_name = "zq-test-flaky"

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.left, self.done = failures, threading.Event()

    def step(self) -> None:
        if self.left:
            self.left -= 1
            raise ValueError("a bug in one step")
        self.done.set()
        self._stop.wait(0.05)


def test_a_failing_step_is_logged_once_and_its_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="worker.daemon")
    flaky = Flaky(failures=4).start()
    try:
        watch = flaky.watches["zq-test-flaky"]
        assert flaky.done.wait(10)
        wait_for(lambda: watch.failing_since is None)
        assert watch.errors["ValueError"] == 4
        lines = [r.getMessage() for r in caplog.records]
        assert sum("failed (ValueError" in line for line in lines) == 1
        assert sum("recovered after 4 failures" in line for line in lines) == 1
        assert flaky.problems() == []
    finally:
        flaky.stop()


def test_a_thread_that_keeps_failing_makes_its_process_unhealthy(
    settings: WorkerSettings, ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon, "UNHEALTHY_AFTER_S", 0.3)
    broken = Flaky(failures=10**9).start()
    heartbeat = ProcessHeartbeat(settings, "worker")
    try:
        wait_for(lambda: bool(daemon.problems()))
        proc = heartbeat.process()
        assert proc.state.startswith("failing: zq-test-flaky: failing for")
        assert "ValueError=" in proc.errors
        assert verdict([proc], "worker", None)[1] is not None
    finally:
        broken.stop()
    assert heartbeat.process().state == "running"


def test_a_search_server_with_failing_threads_stops_claiming_its_shards(
    ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon, "UNHEALTHY_AFTER_S", 0.3)
    server = SearchServer(ctx).start()
    key = ctx.keys.searcher(ctx.consumer)
    try:
        wait_for(lambda: ctx.redis.exists(key) == 1)
        broken = Flaky(failures=10**9)
        monkeypatch.setattr(server, "problems", broken.problems)
        broken.start()
        wait_for(lambda: ctx.redis.exists(key) == 0)
        broken.stop()
    finally:
        server.stop()
