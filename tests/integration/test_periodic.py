"""Beat runs of the periodic jobs through real Redis and real ingest: incremental (a namespace
nobody changed is skipped), bounded (the rest is carried to the next run), visible in stats."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import msgpack
import pytest

from producer import MemoryClient
from tests.conftest import drain_all, make_settings
from tests.e2e.workers import wait_until
from tests.integration.test_consolidation import OTHER, SOLAR
from worker.context import WorkerContext
from worker.index.projection import freeze, snapshot_path, write_snapshot
from worker.index.vector import VectorIndex
from worker.organise.periodic import PeriodicRun, last_runs, run_periodic
from worker.runtime.organiser import OrganiseServer
from worker.runtime.snapshotter import Snapshotter, snapshot_all


def build(tmp_path, **overrides) -> WorkerContext:
    return WorkerContext.build(make_settings(tmp_path, consolidate_min_weight=0.2, **overrides))


@pytest.fixture
def pctx(redis_db, tmp_path) -> Iterator[WorkerContext]:
    ctx = build(tmp_path)
    yield ctx
    ctx.close()


def seed(ctx: WorkerContext, *namespaces: str) -> None:
    with MemoryClient(ctx.settings) as mem:
        for ns in namespaces:
            mem.store_many([SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]], namespace=ns)
    drain_all(ctx)


def last_run(ctx: WorkerContext, job: str) -> PeriodicRun:
    return last_runs(ctx)[job]


def test_an_unchanged_namespace_is_skipped_by_the_next_run(pctx):
    seed(pctx, "a", "b")

    assert run_periodic(pctx, "importance") > 0
    assert last_run(pctx, "importance").namespaces == 2

    assert run_periodic(pctx, "importance") == 0  # a productive run's second look finds nothing
    assert last_run(pctx, "importance").namespaces == 2
    assert run_periodic(pctx, "importance") == 0
    assert last_run(pctx, "importance").namespaces == 0  # neither changed since

    seed(pctx, "b")
    run_periodic(pctx, "importance")
    with MemoryClient(pctx.settings) as mem:
        assert last_run(pctx, "importance").namespaces == 1
        assert mem.stats("b").jobs["importance"].at > mem.stats("a").jobs["importance"].at


def test_a_job_that_changed_notes_looks_once_more_then_skips(pctx):
    seed(pctx, "c")

    assert run_periodic(pctx, "consolidate") == 1  # the insight enters the change log
    assert run_periodic(pctx, "consolidate") == 0
    assert last_run(pctx, "consolidate").namespaces == 1
    run_periodic(pctx, "consolidate")
    assert last_run(pctx, "consolidate").namespaces == 0


def test_another_jobs_work_makes_a_namespace_due_again(pctx):
    seed(pctx, "d")
    run_periodic(pctx, "evict")
    run_periodic(pctx, "evict")
    assert last_run(pctx, "evict").namespaces == 0

    assert run_periodic(pctx, "consolidate") == 1

    run_periodic(pctx, "evict")
    assert last_run(pctx, "evict").namespaces == 1


def test_with_one_namespace_per_run_two_changed_namespaces_take_two_runs(redis_db, tmp_path):
    ctx = build(tmp_path, periodic_max_namespaces=1)
    try:
        seed(ctx, "n1", "n2")

        run_periodic(ctx, "consolidate")
        first = last_run(ctx, "consolidate")
        run_periodic(ctx, "consolidate")
        second = last_run(ctx, "consolidate")

        assert (first.namespaces, first.left, first.work) == (1, 1, 1)
        assert (second.namespaces, second.left, second.work) == (1, 1, 1)  # n1 is due again
        with MemoryClient(ctx.settings) as mem:
            assert {ns: mem.stats(ns).jobs["consolidate"].work for ns in ("n1", "n2")} == {
                "n1": 1,
                "n2": 1,
            }
    finally:
        ctx.close()


def test_a_run_stops_visiting_namespaces_once_its_work_bound_is_reached(redis_db, tmp_path):
    ctx = build(tmp_path, periodic_max_work=1)
    try:
        seed(ctx, "w1", "w2", "w3")

        run_periodic(ctx, "importance")

        run = last_run(ctx, "importance")
        assert (run.namespaces, run.left) == (1, 2) and run.work > 0
        run_periodic(ctx, "importance")
        run_periodic(ctx, "importance")
        with MemoryClient(ctx.settings) as mem:
            assert all("importance" in mem.stats(ns).jobs for ns in ("w1", "w2", "w3"))
    finally:
        ctx.close()


def test_eviction_within_the_work_bound_carries_the_rest_to_the_next_runs(redis_db, tmp_path):
    ctx = build(tmp_path, max_notes=2, periodic_max_work=2)
    try:
        seed(ctx, "e")

        assert [run_periodic(ctx, "evict") for _ in range(3)] == [2, 1, 0]

        with MemoryClient(ctx.settings) as mem:
            assert mem.stats("e").notes == 2
        run_periodic(ctx, "evict")
        assert last_run(ctx, "evict").namespaces == 0
    finally:
        ctx.close()


def test_stats_show_the_last_run_of_each_job_here_and_runs_overall(pctx):
    seed(pctx, "s")

    work = run_periodic(pctx, "importance")

    with MemoryClient(pctx.settings) as mem:
        mine = mem.stats("s").jobs["importance"]
    overall = last_run(pctx, "importance")
    assert mine.job == "importance" and mine.work == work and mine.at > 0 and mine.seconds >= 0
    assert overall.at <= mine.at and overall.work == work and overall.seconds >= mine.seconds
    assert (overall.namespaces, overall.left) == (1, 0)


def test_a_namespace_whose_job_fails_stays_due_and_does_not_stop_the_others(pctx):
    seed(pctx, "bad", "good")
    pctx.redis.hset(pctx.keys.clusters("bad"), "insight-x", b"\xc1")  # undecodable entry

    assert run_periodic(pctx, "consolidate") == 1

    run = last_run(pctx, "consolidate")
    assert (run.namespaces, run.left) == (2, 1)
    with MemoryClient(pctx.settings) as mem:
        assert "consolidate" not in mem.stats("bad").jobs
        assert mem.stats("good").jobs["consolidate"].work == 1


def test_organise_counts_as_a_run_so_periodic_runs_only_look_once_more(pctx):
    seed(pctx, "o")
    srv = OrganiseServer(pctx).start()
    try:
        with MemoryClient(pctx.settings) as mem:
            mem.organise("o", jobs=["importance"])
    finally:
        srv.stop()

    assert run_periodic(pctx, "importance") == 0  # the second look after organise's work
    assert last_run(pctx, "importance").namespaces == 1
    assert run_periodic(pctx, "importance") == 0
    assert last_run(pctx, "importance").namespaces == 0


def test_an_unregistered_job_is_skipped(pctx):
    seed(pctx, "u")

    assert run_periodic(pctx, "sleep") == 0


def test_snapshots_save_only_the_namespaces_that_moved(pctx):
    seed(pctx, "x", "y")

    assert snapshot_all(pctx) == 2
    assert snapshot_all(pctx) == 0

    seed(pctx, "y")
    assert snapshot_all(pctx) == 1
    assert last_run(pctx, "snapshot").namespaces == 1


def test_a_snapshot_run_saves_only_projections_the_process_holds(pctx):
    seed(pctx, "x")
    other = WorkerContext.build(pctx.settings)  # a process that never served "x"
    try:
        assert snapshot_all(other) == 0
        assert other.held_projections() == {}
    finally:
        other.close()


def test_a_process_saves_its_projections_on_its_own_interval(tmp_path):
    ctx = build(tmp_path, snapshot_every_s=0.1)
    try:
        seed(ctx, "x")
        path = snapshot_path(ctx, "x")
        assert not path.exists()
        snapshotter = Snapshotter(ctx).start()
        try:
            wait_until(path.exists, 10)
        finally:
            snapshotter.stop()
        assert last_run(ctx, "snapshot").work == 1
    finally:
        ctx.close()


def test_a_snapshot_loads_its_notes_keywords_and_terms_as_held_and_so_does_an_older_format(
    pctx, caplog
):
    """A snapshot's sidecar holds maps (format 3); a format 2 sidecar, (seq, value) pairs as the
    versions before wrote them, loads the same."""
    caplog.set_level(logging.INFO, logger="worker.index.projection")
    seed(pctx, "x")
    proj = pctx.projection("x")
    path = write_snapshot(pctx, freeze(pctx, proj))
    meta = path.with_suffix(".meta")
    side = msgpack.unpackb(meta.read_bytes(), strict_map_key=False)
    older = dict(side, format=2, **{k: list(side[k].items()) for k in ("ids", "keywords", "terms")})
    for raw in (side, older):
        meta.write_bytes(msgpack.packb(raw, use_bin_type=True))
        restarted = WorkerContext.build(pctx.settings)
        caplog.clear()
        try:
            loaded = restarted.projection("x")
            assert "loaded snapshot ns=x" in caplog.text  # not rebuilt from Redis
            assert loaded.position == proj.position
            assert (loaded.ids, loaded.keywords) == (proj.ids, proj.keywords)
            assert loaded.lexical.docs == proj.lexical.docs
            assert len(loaded.index) == len(proj.index)
        finally:
            restarted.close()


@pytest.mark.parametrize("sidecar", [msgpack.packb([3, "x"]), b"\x81"])
def test_a_snapshot_whose_sidecar_is_not_a_whole_map_is_rebuilt_from_redis(pctx, caplog, sidecar):
    caplog.set_level(logging.INFO, logger="worker.index.projection")
    seed(pctx, "x")
    proj = pctx.projection("x")
    path = write_snapshot(pctx, freeze(pctx, proj))
    path.with_suffix(".meta").write_bytes(sidecar)
    restarted = WorkerContext.build(pctx.settings)
    try:
        assert set(restarted.projection("x").ids.values()) == set(proj.ids.values())
        assert "unusable" in caplog.text and "rebuilt ns=x" in caplog.text
    finally:
        restarted.close()


def test_a_snapshot_copies_an_approximate_index_apart_with_the_notes_organised_meanwhile(
    redis_db, tmp_path
):
    """An IVF index is copied list by list; notes organised before the copy is finished (here
    as it finishes, holding the lock) are in it, as they are in the maps saved beside it."""
    ctx = build(tmp_path, ann_threshold=20)
    try:
        with MemoryClient(ctx.settings) as mem:
            mem.store_many([f"note {i} about topic {i % 7}" for i in range(60)], namespace="x")
            drain_all(ctx)
            proj = ctx.projection("x")
            assert proj.index.kind == "ivf"

            def meanwhile() -> None:
                mem.store_many([f"later note {i}" for i in range(10)], namespace="x")
                drain_all(ctx)

            frozen = freeze(ctx, proj, meanwhile)
        assert len(proj.ids) == len(frozen.side["ids"]) == 70
        path = write_snapshot(ctx, frozen)
        saved = VectorIndex.load(path)
        assert (saved.kind, len(saved)) == ("ivf", 70)
        assert all(seq in saved for seq in frozen.side["ids"])
        assert not proj.index._copies  # the copy keeps no more changes
    finally:
        ctx.close()


def test_a_snapshot_is_written_from_its_copy_while_the_projection_moves_on(pctx):
    """The projection's lock is held for the copy only: notes organised while the snapshot is
    written are not in it, and a process that loads it catches up on them."""
    seed(pctx, "x")
    proj = pctx.projection("x")
    frozen = freeze(pctx, proj)
    first = set(proj.ids.values())
    seed(pctx, "x")  # organised (the projection moves) before the snapshot is written
    assert set(pctx.projection("x").ids.values()) > first
    path = write_snapshot(pctx, frozen)
    side = msgpack.unpackb(path.with_suffix(".meta").read_bytes(), strict_map_key=False)
    assert side["position"] == frozen.side["position"] != proj.position
    assert set(side["ids"].values()) == first
    assert len(VectorIndex.load(path)) == len(first)
    held = dict(proj.ids)
    frozen.release()  # as the snapshotter drops it once written: its maps go, not the projection's
    assert [len(frozen.side[name]) for name in ("ids", "keywords", "terms")] == [0, 0, 0]
    assert proj.ids == held and len(proj.keywords) == len(held)

    restarted = WorkerContext.build(pctx.settings)
    try:
        loaded = restarted.projection("x")
        assert set(loaded.ids.values()) == set(proj.ids.values())  # the snapshot, caught up
        assert len(loaded.index) == len(proj.index)
    finally:
        restarted.close()
