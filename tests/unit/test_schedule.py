from __future__ import annotations

import pytest

from producer import InvalidSetting
from worker.organise.periodic import (
    JOBS,
    MAX_AGE_S,
    Due,
    changed_at,
    interval_s,
    is_due,
    select_due,
)
from worker.runtime.schedule import build_beat_schedule
from worker.settings import WorkerSettings


def test_every_registered_job_is_scheduled_and_nothing_else() -> None:
    schedule = build_beat_schedule(WorkerSettings())

    assert set(schedule) == {f"zq.{job}" for job in JOBS}  # snapshots are per process
    for job in JOBS:
        assert schedule[f"zq.{job}"]["task"] == "zq.periodic"
        assert schedule[f"zq.{job}"]["args"] == [job]


def test_the_schedule_runs_eviction_at_its_interval() -> None:
    schedule = build_beat_schedule(WorkerSettings(evict_every_s=120.0))

    assert schedule["zq.evict"]["schedule"] == 120.0


@pytest.mark.parametrize("evict_s", [300.0, 10.0])
def test_each_task_expires_at_nine_tenths_of_its_interval(evict_s: float) -> None:
    schedule = build_beat_schedule(WorkerSettings(evict_every_s=evict_s))

    assert schedule["zq.evict"]["options"] == {"expires": pytest.approx(0.9 * evict_s)}


def test_importance_and_consolidation_run_at_their_intervals() -> None:
    schedule = build_beat_schedule(
        WorkerSettings(importance_every_s=60.0, consolidate_every_s=1_800.0)
    )

    assert schedule["zq.importance"] == {
        "task": "zq.periodic",
        "args": ["importance"],
        "schedule": 60.0,
        "options": {"expires": pytest.approx(54.0)},
    }
    assert schedule["zq.consolidate"]["schedule"] == 1_800.0


def test_a_job_without_an_interval_of_its_own_runs_at_the_periodic_interval() -> None:
    s = WorkerSettings(periodic_every_s=77.0)

    assert interval_s(s, "merge") == 77.0
    assert interval_s(s, "evict") == s.evict_every_s


def test_a_namespace_is_due_when_it_changed_after_the_last_run_began() -> None:
    assert is_due("evict", Due("a", last_run=0.0, changed=5.0), now=10.0)
    assert is_due("evict", Due("a", last_run=4.0, changed=5.0), now=10.0)
    assert not is_due("evict", Due("a", last_run=6.0, changed=5.0), now=10.0)
    assert not is_due("evict", Due("a", last_run=0.0, changed=0.0), now=10.0)


def test_a_productive_run_looks_once_more_as_it_may_have_stopped_at_its_cap() -> None:
    assert is_due("evolve", Due("a", last_run=6.0, changed=5.0, last_work=64), now=10.0)
    assert not is_due("evolve", Due("a", last_run=6.0, changed=5.0, last_work=0), now=10.0)


def test_importance_is_also_due_once_its_last_run_is_old() -> None:
    last = 1_000.0
    old = last + MAX_AGE_S["importance"] + 1

    assert is_due("importance", Due("a", last_run=last, changed=0.0), now=old)
    assert not is_due("evict", Due("a", last_run=last, changed=0.0), now=old)


def test_due_namespaces_go_least_recently_run_first() -> None:
    states = [
        Due("b", last_run=3.0, changed=9.0),
        Due("a", last_run=3.0, changed=9.0),
        Due("c", last_run=0.0, changed=9.0),
        Due("d", last_run=9.5, changed=9.0),
    ]

    assert select_due("evict", states, now=10.0) == ["c", "a", "b"]


def test_a_jobs_own_productive_runs_do_not_make_it_due_but_others_do() -> None:
    stats = {b"last_ingest": b"1.0", b"changed_importance": b"7.0", b"changed_evict": b"3.0"}

    assert changed_at("importance", stats, None) == 3.0
    assert changed_at("evict", stats, None) == 7.0
    assert changed_at("evict", stats, b"8500-0") == 8.5


def test_the_beat_lock_must_outlive_two_ticks() -> None:
    assert WorkerSettings(beat_lock_s=10.0, beat_tick_s=5.0).beat_lock_s == 10.0
    with pytest.raises(
        InvalidSetting, match="ZQ_BEAT_LOCK_S must be at least twice ZQ_BEAT_TICK_S"
    ):
        WorkerSettings(beat_lock_s=5.0, beat_tick_s=5.0)
