"""worker.context: what building a worker process's context sets up."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_settings
from worker.context import GC_YOUNG_THRESHOLD, WorkerContext


@pytest.fixture
def default_gc() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


@pytest.mark.usefixtures("default_gc")
def test_build_raises_the_young_gc_threshold_and_keeps_the_older_ones(tmp_path: Path) -> None:
    ctx = WorkerContext.build(make_settings(tmp_path))
    ctx.close()

    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
