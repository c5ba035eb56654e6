"""Helpers of the fault-injection tests: real `zettelq worker` processes and their signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from celery import Celery

from worker.settings import WorkerSettings


def worker_env(settings: WorkerSettings) -> dict[str, str]:
    env = dict(os.environ)  # holds no ZQ_ variable of the shell (tests/conftest.py)
    env.update(
        {
            "ZQ_REDIS_URL": settings.redis_url,
            "ZQ_KEY_PREFIX": settings.key_prefix,
            "ZQ_SHARD_COUNT": str(settings.shard_count),
            "ZQ_INDEX_DIR": str(settings.index_dir),
            "ZQ_LEASE_S": str(settings.lease_s),
            "ZQ_SWEEP_INTERVAL_S": "0.5",
        }
    )
    return env


def wait_until(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def wait_ready(settings: WorkerSettings, count: int, timeout_s: float = 60.0) -> None:
    """Wait until ``count`` workers answer a Celery ping on the settings' broker (each one then
    consumes tasks). Only for a broker no other test's workers use (an own redis-server). A
    Sentinel broker is reached with the workers' own transport options (the master's name)."""
    probe = Celery(broker=settings.broker)
    probe.conf.broker_transport_options = settings.broker_transport_options
    try:
        wait_until(lambda: len(probe.control.ping(timeout=0.5)) >= count, timeout_s)
    finally:
        probe.close()


def spawn(settings: WorkerSettings, **env: str) -> subprocess.Popen[bytes]:
    """A `zettelq worker` in a process group of its own (so signals reach its pool child too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"],
        env={**worker_env(settings), **env},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def spawn_searcher(settings: WorkerSettings, **env: str) -> subprocess.Popen[bytes]:
    """A `zettelq searcher` in a process group of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "searcher"],
        env={**worker_env(settings), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass  # the whole group is gone already


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return members


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole group and return once every member is dead (its sockets closed): the
    main process is reaped by ``wait``, its pool child may outlive that by a moment."""
    signal_group(proc, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: not group_members(proc.pid), 10)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM), then SIGKILL of the whole group, so that no pool child outlives
    the test and takes later tests' tasks."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGCONT)
        signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc, signal.SIGKILL)
    proc.wait()


@contextmanager
def running(
    settings: WorkerSettings, count: int = 1, **env: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [spawn(settings, **env) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            stop(proc)
