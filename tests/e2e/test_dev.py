"""``zettelq dev``: its embedded Redis keeps the notes in ``--data-dir`` across a restart of the
whole stack (a developer's agents must not lose their memories at Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from producer import MemoryClient
from tests.conftest import make_settings
from tests.e2e.workers import wait_until, worker_env
from worker.runtime.devserver import EmbeddedRedis, redis_reachable
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e


def _dev(settings: WorkerSettings, data_dir: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "dev", "--data-dir", str(data_dir)],
        env=worker_env(settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_until(lambda: redis_reachable(settings.redis_url), 30)
    return proc


def _interrupt(proc: subprocess.Popen[bytes], settings: WorkerSettings) -> None:
    """Ctrl-C: the stack stops, its Redis with it."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    assert not redis_reachable(settings.redis_url)


def test_notes_stored_through_zettelq_dev_survive_its_restart(tmp_path: Path) -> None:
    port = EmbeddedRedis().port  # a free loopback port: the stack starts its own Redis there
    settings = make_settings(tmp_path, redis_url=f"redis://127.0.0.1:{port}/0")
    data_dir = tmp_path / "redis"
    proc = _dev(settings, data_dir)
    try:
        with MemoryClient(settings) as mem:
            note = mem.store("The staging database restarts on Sundays.", namespace="ops")
            mem.flush("ops", timeout_s=60)
        _interrupt(proc, settings)
        assert os.listdir(data_dir)

        proc = _dev(settings, data_dir)
        with MemoryClient(settings) as mem:
            assert mem.get(note, namespace="ops").content.startswith("The staging database")
            hits = mem.search("staging database restart", namespace="ops", timeout_s=60)
        assert [h.id for h in hits] == [note]
        _interrupt(proc, settings)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
