"""Helpers of the fault-injection tests: real `zettelq worker` processes and their signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.e2e.test_worker_process import worker_env
from worker.settings import WorkerSettings


def spawn(settings: WorkerSettings, **env: str) -> subprocess.Popen[bytes]:
    """A `zettelq worker` in a process group of its own (so signals reach its pool child too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "worker", "--loglevel=WARNING"],
        env={**worker_env(settings), **env},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    os.killpg(proc.pid, signum)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM), SIGKILL of the whole group if it lingers."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGCONT)
        signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
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
