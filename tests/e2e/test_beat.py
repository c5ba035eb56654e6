"""End to end: real `zettelq beat` processes (celery-redbeat) and a real `zettelq worker`.

Two beats against one Redis send each periodic task once per interval (one leader); when the
leader is SIGKILLed the other takes over after its lock expires and continues the schedule. A
worker runs what beat sends, stats() and `zettelq runs` show it; organise() is answered by the
worker process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from itertools import pairwise

import pytest
from redis import Redis

from producer import MemoryClient
from tests.e2e.workers import running, signal_group, stop, wait_until, worker_env
from tests.integration.test_consolidation import OTHER, SOLAR
from worker.organise.periodic import JOBS
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

EVERY_S = 1.0  #: interval of every periodic task in these tests
STARTUP_S = 120.0  #: how long processes may take to start on a loaded machine
BEAT_ENV = {
    "ZQ_EVICT_EVERY_S": str(EVERY_S),
    "ZQ_SNAPSHOT_EVERY_S": str(EVERY_S),
    "ZQ_IMPORTANCE_EVERY_S": str(EVERY_S),
    "ZQ_CONSOLIDATE_EVERY_S": str(EVERY_S),
    "ZQ_PERIODIC_EVERY_S": str(EVERY_S),
    "ZQ_JUDGE_MAX_WAIT_S": str(EVERY_S),  # the judge job runs at that interval
    "ZQ_BEAT_LOCK_S": "4",
    "ZQ_BEAT_TICK_S": "0.25",
}


def spawn_beat(settings: WorkerSettings) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "beat", "--loglevel=WARNING"],
        env={**worker_env(settings), **BEAT_ENV},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def sent(r: Redis, settings: WorkerSettings) -> list[dict[str, object]]:
    """The task messages waiting on the maint queue (no worker takes them), oldest first."""
    raw = r.lrange(f"{settings.key_prefix}.maint", 0, -1)
    return [json.loads(message)["headers"] for message in reversed(raw)]


def origin_pid(headers: dict[str, object]) -> int:
    """The pid of the process that sent the message (origin is gen<pid>@<host>)."""
    return int(str(headers["origin"]).split("@")[0].removeprefix("gen"))


def sent_at(headers: dict[str, object]) -> float:
    """When beat sent it: every entry expires at nine tenths of its interval after sending."""
    return datetime.fromisoformat(str(headers["expires"])).timestamp() - 0.9 * EVERY_S


def assert_once_per_interval(messages: list[dict[str, object]]) -> None:
    times: dict[str, list[float]] = defaultdict(list)
    for h in messages:
        times[f"{h['task']}{h['argsrepr']}"].append(sent_at(h))
    assert len(times) == len(JOBS)  # every job (snapshots are the worker processes' own)
    for entry, ts in times.items():
        gaps = [b - a for a, b in pairwise(ts)]
        assert all(g > 0.5 * EVERY_S for g in gaps), (entry, gaps)


def test_two_beats_send_each_task_once_per_interval_and_the_standby_takes_over(settings, redis_db):
    beats = {p.pid: p for p in (spawn_beat(settings), spawn_beat(settings))}
    try:
        wait_until(lambda: len(sent(redis_db, settings)) >= 4 * len(JOBS), STARTUP_S)
        before = sent(redis_db, settings)
        senders = {origin_pid(h) for h in before}
        assert len(senders) == 1 and senders <= set(beats)  # one leader; the other stood by
        assert_once_per_interval(before)
        (leader,) = senders
        (standby,) = set(beats) - senders
        assert beats[standby].poll() is None

        signal_group(beats[leader], signal.SIGKILL)
        beats[leader].wait()
        wait_until(lambda: sum(origin_pid(h) == standby for h in sent(redis_db, settings)) >= 8, 60)

        after = sent(redis_db, settings)
        assert after[: len(before)] == before
        assert {origin_pid(h) for h in after[len(before) :]} <= {leader, standby}
        assert_once_per_interval(after)  # no double send across the takeover either
    finally:
        for proc in beats.values():
            stop(proc)


def test_a_worker_runs_what_beat_sends_and_stats_show_each_run(settings, redis_db):
    with MemoryClient(settings) as mem:
        ids = mem.store_many([SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]], namespace="beat")
        env = {**BEAT_ENV, "ZQ_CONSOLIDATE_MIN_WEIGHT": "0.2"}
        with running(settings, **env):
            beat = spawn_beat(settings)
            try:
                # the judge job visits only namespaces whose LLM judge queue holds notes, and
                # with the heuristic judge (the default) nothing is queued
                visited = set(JOBS) - {"judge"}
                wait_until(lambda: set(mem.stats("beat").jobs) == visited, STARTUP_S)
                # consolidation's insight: its productive run may already be followed by a
                # look-again run (work 0) by the time every job has run once, so the effect
                wait_until(lambda: mem.stats("beat").notes == 6)
                # the worker process saves its own projections every ZQ_SNAPSHOT_EVERY_S
                wait_until(lambda: "snapshot" in mem.stats("beat").last)
            finally:
                stop(beat)
        stats = mem.stats("beat")
        assert stats.notes == 6  # five notes and their insight
        # the last run may be the look-again after a productive one (work 0): check the effect
        assert stats.jobs["importance"].at > 0
        assert any(mem.get(nid, namespace="beat").importance != 0.5 for nid in ids)
    out = subprocess.run(
        [sys.executable, "-m", "worker.cli.main", "runs", "--json"],
        env=worker_env(settings),
        capture_output=True,
        check=True,
    )
    runs = {r["job"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(runs) == {*JOBS, "snapshot"}
    assert all(r["at"].endswith("Z") and r["namespaces"] >= 0 for r in runs.values())


def test_organise_is_answered_by_a_worker_process(settings):
    with MemoryClient(settings) as mem, running(settings, ZQ_CONSOLIDATE_MIN_WEIGHT="0.2"):
        ids = mem.store_many([SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]], namespace="proc")
        done = mem.organise("proc", timeout_s=60)
        assert [r.job for r in done.runs] == list(JOBS)
        assert done.work["consolidate"] == 1 and done.work["importance"] > 0
        assert all(mem.get(nid, namespace="proc").id == nid for nid in ids)


def test_the_cli_organises_a_namespace_through_a_worker(settings):
    env = worker_env(settings)
    with MemoryClient(settings) as mem, running(settings, ZQ_CONSOLIDATE_MIN_WEIGHT="0.2"):
        mem.store_many([SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]], namespace="cli")
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "worker.cli.main",
                "organise",
                "cli",
                "--json",
                "--timeout",
                "60",
            ],
            env=env,
            capture_output=True,
            check=True,
        )
        done = json.loads(out.stdout)
        assert [r["job"] for r in done["runs"]] == list(JOBS)
        work = {r["job"]: r["work"] for r in done["runs"]}
        assert done["done"] and work["consolidate"] == 1
        lines = subprocess.run(
            [
                sys.executable,
                "-m",
                "worker.cli.main",
                "organise",
                "cli",
                "--jobs",
                "importance",
                "--json",
            ],
            env=env,
            capture_output=True,
            check=True,
            text=True,
        ).stdout.splitlines()
        assert len(lines) == 1 and [r["job"] for r in json.loads(lines[0])["runs"]] == [
            "importance"
        ]


def test_the_cli_reports_a_failed_organise_without_a_worker(settings):
    out = subprocess.run(
        [sys.executable, "-m", "worker.cli.main", "organise", "nobody", "--timeout", "0.5"],
        env=worker_env(settings),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and out.stderr.startswith("zettelq: error: no reply")
    assert "is a worker running?" in out.stderr and len(out.stderr.splitlines()) == 1
