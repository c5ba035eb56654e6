"""``zettelq demo`` as a newcomer runs it: its own worker, every query answered, and nothing on
stderr but what zettelq itself has to say (no traceback, no Celery warning about root)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.workers import worker_env
from worker.cli.demo import QUERIES
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e


def test_the_demo_prints_every_query_and_no_library_noise(settings: WorkerSettings) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli.main", "demo"],
        env=worker_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for query in QUERIES:
        assert f"search: {query!r}" in done.stdout
    assert "stats: notes=7" in done.stdout
    assert "Traceback" not in done.stderr
    assert "superuser" not in done.stderr
    assert "AVX" not in done.stderr + done.stdout
