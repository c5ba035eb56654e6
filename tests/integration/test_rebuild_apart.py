"""An index rebuild a drain makes due (the flat index outgrowing ZQ_ANN_THRESHOLD here; an IVF
index's retrain as it grows 4x, 9 s at 329k notes) runs in a thread of its own: the drain goes
on organising while it is built, and the notes organised meanwhile reach the new index."""

from __future__ import annotations

from producer import MemoryClient
from tests.conftest import drain_all, held_rebuilds
from worker.context import WorkerContext
from worker.intake.drain import drain_shard
from worker.settings import WorkerSettings

NS = "apart"


def notes(start: int, stop: int) -> list[str]:
    return [f"note {i} about topic {i % 9} and the word w{i}" for i in range(start, stop)]


def test_a_drain_goes_on_while_the_index_it_made_due_is_rebuilt(settings: WorkerSettings) -> None:
    ctx = WorkerContext.build(settings.model_copy(update={"ann_threshold": 40}))
    try:
        with MemoryClient(settings) as mem, held_rebuilds() as held:
            ids = mem.store_many(notes(0, 60), namespace=NS)
            assert drain_all_but_the_rebuild(ctx) == 60
            assert held.building.wait(30)  # passing 40 notes made it due: its thread is building
            proj = ctx.projection(NS)
            ids += mem.store_many(notes(60, 120), namespace=NS)
            assert drain_all_but_the_rebuild(ctx) > 0  # organised while the build is held
            assert proj.rebuilding() and proj.index.kind == "flat"
            assert len(proj.index) == 120
            held.go_on.set()
            assert proj.wait_settled(30)
        assert (proj.index.kind, len(proj.index)) == ("ivf", 120)
        assert set(proj.ids.values()) == set(ids)
        assert drain_all(ctx) == 0
    finally:
        ctx.close()


def drain_all_but_the_rebuild(ctx: WorkerContext) -> int:
    """What ``drain_all`` does short of waiting for the rebuild."""
    return sum(drain_shard(ctx, s).processed for s in range(ctx.keys.shard_count))
