"""Search affinity against the real Redis, with real search servers in threads: a namespace's
searches are answered by the process that drains its shard, other processes take over when it
stops, dies or falls behind, and searches over several namespaces go to every process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from producer import MemoryClient
from tests.conftest import drain_all
from tests.e2e.workers import wait_until
from worker.context import WorkerContext
from worker.runtime.servers import SearchServer
from worker.search import routing
from worker.settings import WorkerSettings

NOTES = [
    "The billing service retries failed card payments three times.",
    "Card payments above the limit need a second approval.",
    "The deploy pipeline runs the billing tests before every release.",
]


@contextmanager
def process(settings: WorkerSettings) -> Iterator[WorkerContext]:
    """A worker process's context (its own consumer name and projections)."""
    ctx = WorkerContext.build(settings)
    try:
        yield ctx
    finally:
        ctx.close()


@contextmanager
def serving(ctx: WorkerContext) -> Iterator[SearchServer]:
    server = SearchServer(ctx).start()
    try:
        wait_until(lambda: ctx.redis.exists(ctx.keys.searcher(ctx.consumer)), 5)
        yield server
    finally:
        server.stop()


@pytest.fixture
def pair(settings: WorkerSettings, client: MemoryClient) -> Iterator[tuple[WorkerContext, ...]]:
    """Two worker processes, a and b; a has organised the namespace "billing" (so it drains
    its shard)."""
    client.store_many(NOTES, namespace="billing")
    with process(settings) as a, process(settings) as b:
        drain_all(a)
        yield a, b


def _searches(client: MemoryClient, ns: str, times: int = 10) -> None:
    for _ in range(times):
        assert client.search("card payments", namespace=ns, fresh=False, k=2)


def test_the_drainer_answers_its_namespaces_searches_and_no_other_process_opens_it(
    pair: tuple[WorkerContext, ...], client: MemoryClient
) -> None:
    a, b = pair
    assert a.redis.get(a.keys.drainer(a.keys.shard_of("billing"))) == a.consumer.encode()
    with serving(a), serving(b):
        _searches(client, "billing")
    assert "billing" in a.projections
    assert "billing" not in b.projections


def test_a_stopped_drainers_namespaces_are_served_by_another_process(
    pair: tuple[WorkerContext, ...], client: MemoryClient
) -> None:
    a, b = pair
    with serving(b):
        with serving(a):
            _searches(client, "billing", 3)
        assert not a.redis.exists(a.keys.searcher(a.consumer))  # deleted on stop
        _searches(client, "billing", 3)  # b takes the shard within a refresh
    assert "billing" in b.projections


def test_a_dead_drainers_namespaces_are_served_once_its_searcher_key_lapses(
    pair: tuple[WorkerContext, ...], client: MemoryClient
) -> None:
    a, b = pair
    # a's process was killed while serving: its key outlives it by at most LIVE_S
    a.redis.set(a.keys.searcher(a.consumer), 1, px=int(routing.LIVE_S * 1000))
    shard_list = a.keys.shard_search(a.keys.shard_of("billing"))
    assert shard_list not in routing.served(b, b.redis)
    with serving(b):
        hits = client.search("card payments", namespace="billing", fresh=False, timeout_s=8)
    assert hits
    assert not a.redis.exists(a.keys.searcher(a.consumer))


def test_other_processes_help_a_drainer_whose_list_backs_up(ctx: WorkerContext) -> None:
    keys, shard = ctx.keys, 1
    ctx.redis.set(keys.drainer(shard), "busy-worker")
    ctx.redis.set(keys.searcher("busy-worker"), 1, px=10_000)
    for _ in range(routing.HELP_AT - 1):
        ctx.redis.lpush(keys.shard_search(shard), b"queued")
    assert keys.shard_search(shard) not in routing.served(ctx, ctx.redis)
    ctx.redis.lpush(keys.shard_search(shard), b"queued")
    assert keys.shard_search(shard) in routing.served(ctx, ctx.redis)


def test_shards_nobody_drains_and_the_shared_list_are_served_by_everyone(
    ctx: WorkerContext,
) -> None:
    keys = ctx.keys
    ctx.redis.set(keys.drainer(0), "ingest-only-worker")  # drains but serves no searches
    served = routing.served(ctx, ctx.redis)
    assert set(served) == {keys.shard_search(0), keys.shard_search(1), keys.search_queue()}


def test_each_wait_starts_one_list_further_so_none_starves(ctx: WorkerContext) -> None:
    routes = routing.Routes(ctx)
    firsts = [routes.lists(ctx.redis)[0] for _ in range(3)]
    assert len(set(firsts)) == 3
    assert sorted(routes.lists(ctx.redis)) == sorted(routing.served(ctx, ctx.redis))


def test_a_search_over_several_namespaces_is_answered_from_the_shared_list(
    settings: WorkerSettings, client: MemoryClient
) -> None:
    client.store_many(NOTES[:2], namespace="billing")
    client.store_many(NOTES[2:], namespace="deploys")
    with process(settings) as a, process(settings) as b:
        drain_all(a)
        with serving(b):  # a serves nothing: every list is b's to take
            hits = client.search("billing", namespace=["billing", "deploys"], fresh=False, k=3)
        assert {h.namespace for h in hits} == {"billing", "deploys"}
