from __future__ import annotations

import pytest

from worker.schedule import build_beat_schedule
from worker.settings import WorkerSettings


def test_the_schedule_runs_eviction_and_snapshots_at_their_intervals() -> None:
    schedule = build_beat_schedule(WorkerSettings(evict_every_s=120.0, snapshot_every_s=900.0))

    assert set(schedule) == {"zq.evict", "zq.snapshot", "zq.importance", "zq.consolidate"}
    assert schedule["zq.evict"]["task"] == "zq.evict"
    assert schedule["zq.evict"]["schedule"] == 120.0
    assert schedule["zq.snapshot"]["task"] == "zq.snapshot"
    assert schedule["zq.snapshot"]["schedule"] == 900.0


@pytest.mark.parametrize(("evict_s", "snapshot_s"), [(300.0, 600.0), (10.0, 1.5)])
def test_each_task_expires_at_nine_tenths_of_its_interval(
    evict_s: float, snapshot_s: float
) -> None:
    schedule = build_beat_schedule(
        WorkerSettings(evict_every_s=evict_s, snapshot_every_s=snapshot_s)
    )

    assert schedule["zq.evict"]["options"] == {"expires": pytest.approx(0.9 * evict_s)}
    assert schedule["zq.snapshot"]["options"] == {"expires": pytest.approx(0.9 * snapshot_s)}


def test_the_default_intervals() -> None:
    schedule = build_beat_schedule(WorkerSettings(evict_every_s=300.0, snapshot_every_s=600.0))

    assert schedule["zq.evict"]["schedule"] == 300.0
    assert schedule["zq.snapshot"]["schedule"] == 600.0


def test_importance_and_consolidation_run_at_their_intervals() -> None:
    schedule = build_beat_schedule(
        WorkerSettings(importance_every_s=60.0, consolidate_every_s=1_800.0)
    )

    assert schedule["zq.importance"] == {
        "task": "zq.importance",
        "schedule": 60.0,
        "options": {"expires": pytest.approx(54.0)},
    }
    assert schedule["zq.consolidate"]["task"] == "zq.consolidate"
    assert schedule["zq.consolidate"]["schedule"] == 1_800.0
