"""The projections a worker process keeps are bounded by ``max_projection_notes``: opening one
more namespace drops the least recently used, and a dropped one answers the same once reopened."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer import MemoryClient
from producer.protocol import SearchJob
from tests.conftest import drain_all, make_settings
from worker.context import WorkerContext
from worker.search.retrieve import search

NOTES = [
    "Solar panels on the depot roof feed the charging bays.",
    "The charging bays need a new inverter before winter.",
    "Winter tyres go on the delivery vans in November.",
]


@pytest.fixture
def small(redis_db, tmp_path: Path) -> Iterator[WorkerContext]:
    """A process that keeps projections of at most two of the three-note namespaces."""
    ctx = WorkerContext.build(make_settings(tmp_path, max_projection_notes=6))
    with MemoryClient(ctx.settings) as mem:
        for ns in ("a", "b", "c"):
            mem.store_many(NOTES, namespace=ns)
    organiser = WorkerContext.build(ctx.settings)  # another process organises them
    drain_all(organiser)
    organiser.close()
    yield ctx
    ctx.close()


def _ask(ctx: WorkerContext, ns: str) -> list[str]:
    job = SearchJob(
        job_id="j",
        namespaces=[ns],
        query="charging inverter",
        k=3,
        fresh=False,
        deadline=time.time() + 10,
    )
    return [hit.id for hit in search(ctx, job)]


def test_opening_past_the_bound_drops_the_least_recently_used(small: WorkerContext) -> None:
    first = _ask(small, "a")
    _ask(small, "b")
    _ask(small, "a")  # a is now the more recently used
    _ask(small, "c")

    assert list(small.held_projections()) == ["a", "c"]
    assert _ask(small, "b") and list(small.held_projections()) == ["c", "b"]
    assert _ask(small, "a") == first  # reopened from Redis, same answer


def test_a_namespace_larger_than_the_bound_is_still_kept_while_used(
    redis_db, tmp_path: Path
) -> None:
    ctx = WorkerContext.build(make_settings(tmp_path, max_projection_notes=1))
    try:
        with MemoryClient(ctx.settings) as mem:
            mem.store_many(NOTES, namespace="big")
        drain_all(ctx)

        assert list(ctx.held_projections()) == ["big"]
        assert len(_ask(ctx, "big")) == 3
    finally:
        ctx.close()


def test_a_batch_that_grows_a_projection_past_the_bound_drops_the_others(
    small: WorkerContext,
) -> None:
    _ask(small, "a")
    _ask(small, "b")
    assert list(small.held_projections()) == ["a", "b"]
    with MemoryClient(small.settings) as mem:
        more = ["The depot gate opens at six.", "Depot parking is free.", "The depot has a cafe."]
        mem.store_many(more, namespace="b")
    drain_all(small)

    assert list(small.held_projections()) == ["b"]
    assert len(small.projections["b"].ids) == 6
