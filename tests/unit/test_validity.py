"""Bi-temporal validity (pure): what ``as_of`` sees and which candidates rank as superseded."""

from __future__ import annotations

from worker.search.candidates import Cand, passes, superseded, valid_at


def test_a_note_holds_from_its_event_time_else_its_creation_until_valid_to():
    recorded_late = {"created_at": 100.0, "event_time": 10.0, "valid_to": 50.0}
    assert not valid_at(recorded_late, 9.0)
    assert valid_at(recorded_late, 10.0) and valid_at(recorded_late, 49.9)
    assert not valid_at(recorded_late, 50.0)  # the successor holds from here
    plain = {"created_at": 100.0}
    assert not valid_at(plain, 99.0) and valid_at(plain, 100.0) and valid_at(plain, 1e12)


def test_as_of_filters_and_ranking_partition():
    old = Cand("a", "ns", 0, {"created_at": 1.0, "valid_to": 5.0})
    new = Cand("b", "ns", 0, {"created_at": 5.0})
    assert passes(old, {"as_of": 4.0}) and not passes(new, {"as_of": 4.0})
    assert not passes(old, {"as_of": 5.0}) and passes(new, {"as_of": 5.0})
    assert superseded(old, 5.0) and not superseded(old, 4.0) and not superseded(new, 1e12)
