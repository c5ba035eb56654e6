from __future__ import annotations

import pytest

from worker.organise.eviction import Survivor, select_evictions, survival

DAY = 86_400.0
NOW = 1_700_000_000.0


def note(
    note_id: str,
    importance: float = 0.5,
    access_count: int = 0,
    age_days: float = 1.0,
    last_access: float = 0.0,
) -> Survivor:
    return Survivor(note_id, importance, access_count, last_access, NOW - age_days * DAY)


def evict(notes: list[Survivor], max_notes: int) -> list[str]:
    return select_evictions(notes, max_notes, NOW, 30 * DAY)


def test_survival_is_importance_times_accesses_times_recency() -> None:
    n = note("a", importance=0.8, access_count=3, age_days=30)

    assert survival(n, NOW, 30 * DAY) == pytest.approx(0.8 * 4 * 0.5)


@pytest.mark.parametrize("count", [0, 2, 3])
def test_nothing_is_evicted_at_or_under_the_cap(count: int) -> None:
    assert evict([note(f"n{i}") for i in range(count)], max_notes=3) == []


def test_max_notes_zero_means_no_cap() -> None:
    assert evict([note(f"n{i}") for i in range(50)], max_notes=0) == []


def test_only_the_excess_is_evicted_lowest_survival_first() -> None:
    notes = [
        note("keep", importance=0.9),
        note("lowest", importance=0.1),
        note("middle", importance=0.5),
        note("low", importance=0.2),
    ]

    assert evict(notes, max_notes=2) == ["lowest", "low"]


def test_importance_protects_a_note() -> None:
    notes = [note("important", importance=1.0, age_days=30), note("plain", importance=0.3)]

    assert evict(notes, max_notes=1) == ["plain"]


def test_access_count_protects_a_note() -> None:
    notes = [note("read-often", access_count=5, age_days=30), note("never-read", age_days=1)]

    assert evict(notes, max_notes=1) == ["never-read"]


def test_a_recent_access_protects_an_old_note() -> None:
    notes = [note("old-but-read", age_days=300, last_access=NOW), note("newer", age_days=10)]

    assert evict(notes, max_notes=1) == ["newer"]


def test_older_notes_are_evicted_first_on_ties() -> None:
    notes = [note("new", importance=0.0, age_days=1), note("old", importance=0.0, age_days=9)]

    assert evict(notes, max_notes=1) == ["old"]


def test_with_equal_importance_the_older_note_goes_first() -> None:
    notes = [note(f"d{d}", age_days=d) for d in (5, 50, 1, 20)]

    assert evict(notes, max_notes=2) == ["d50", "d20"]
