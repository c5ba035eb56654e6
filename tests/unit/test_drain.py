"""The entry id a drained job is judged by (worker.intake.drain.origin): pure, no Redis."""

from __future__ import annotations

from worker.intake.drain import origin


def test_a_job_is_judged_by_its_own_entry_id() -> None:
    assert origin(b"1700000000500-3", {b"j": b"..."}) == "1700000000500-3"


def test_a_retried_job_is_judged_by_the_entry_id_it_was_first_queued_under() -> None:
    fields = {b"j": b"...", b"o": b"1700000000100-0"}
    assert origin(b"1700000000500-3", fields) == "1700000000100-0"


def test_an_origin_never_makes_a_job_newer_than_its_place_in_the_stream() -> None:
    assert origin(b"1700000000500-3", {b"o": b"9999999999999-0"}) == "1700000000500-3"
    assert origin(b"1700000000500-3", {b"o": b"1700000000500-3"}) == "1700000000500-3"
    assert origin(b"1700000000500-3", {b"o": b"not-an-id"}) == "1700000000500-3"
    assert origin(b"1700000000500-3", {b"o": b"\xff"}) == "1700000000500-3"
