"""The health verdict: which live heartbeats make `zettelq health` pass, and the reason when
none does. Pure: no Redis."""

from __future__ import annotations

from worker.cli.failure import redacted
from worker.cli.health import verdict
from worker.runtime.heartbeat import Process


def proc(role: str, host: str = "h1", state: str = "running") -> Process:
    return Process(
        consumer=f"{host}-1-abc",
        role=role,
        host=host,
        pid=1,
        started=0.0,
        beat=0.0,
        state=state,
        version="0.1.0",
    )


def test_a_matching_live_process_passes() -> None:
    live = [proc("worker", "h1"), proc("searcher", "h2")]

    matching, reason = verdict(live, "worker", "h1")

    assert reason is None
    assert matching == [live[0]]


def test_no_filter_matches_any_live_process() -> None:
    assert verdict([proc("beat", state="standby")], None, None)[1] is None


def test_a_process_of_another_role_or_host_does_not_count() -> None:
    live = [proc("worker", "h1"), proc("searcher", "h2")]

    matching, reason = verdict(live, "searcher", "h1")

    assert matching == []
    assert reason == "no live searcher process on host h1 (live heartbeats: 1 searcher, 1 worker)"


def test_no_heartbeat_at_all_says_so() -> None:
    assert verdict([], None, None)[1] == "no live zettelq process (live heartbeats: none)"


def test_a_beat_is_healthy_as_leader_or_standby_but_not_stale() -> None:
    assert verdict([proc("beat", state="leader")], "beat", None)[1] is None
    assert verdict([proc("beat", state="standby")], "beat", None)[1] is None

    matching, reason = verdict([proc("beat", state="stale")], "beat", None)

    assert len(matching) == 1
    assert reason == "no healthy beat process: state stale"


def test_one_healthy_beat_among_stale_ones_passes() -> None:
    live = [proc("beat", "h1", "stale"), proc("beat", "h2", "standby")]

    assert verdict(live, "beat", None)[1] is None


def test_safe_url_hides_the_password_only() -> None:
    assert redacted("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redacted("rediss://zq:s3cret@redis:6380/1") == "rediss://zq:***@redis:6380/1"
    assert redacted("redis://redis:6379/0") == "redis://redis:6379/0"
