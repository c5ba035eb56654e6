"""A search's dense channel scans at least ZQ_IVF_SEARCH_SHARE of an IVF index's lists
(worker/index/kinds.py ``Ivf.search``), whatever ZQ_IVF_NPROBE (what linking scans) says."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest

from producer import MemoryClient
from producer.protocol import SearchJob
from tests.conftest import drain_all, make_settings
from worker.context import WorkerContext
from worker.search import retrieve
from worker.settings import WorkerSettings

NS = "share"
WORDS = [f"w{i:03d}" for i in range(600)]


@pytest.fixture
def stored(redis_db, tmp_path) -> Iterator[tuple[WorkerSettings, list[str]]]:
    """400 notes of random words, organised into an IVF index of ~40 lists; dense channel only."""
    settings = make_settings(
        tmp_path,
        ann_threshold=100,
        ivf_nprobe=1,
        dense_weight=1.0,
        lexical_weight=0.0,
        graph_weight=0.0,
    )
    rng = random.Random(5)
    texts = [" ".join(rng.sample(WORDS, 12)) for _ in range(400)]
    ctx = WorkerContext.build(settings)
    try:
        with MemoryClient(settings) as mem:
            mem.store_many(texts, namespace=NS)
        drain_all(ctx)
        assert ctx.projection(NS).index.kind == "ivf"
    finally:
        ctx.close()
    yield settings, texts


def found_both(settings: WorkerSettings, texts: list[str], share: float) -> list[bool]:
    """For pairs of notes, whether a search for their two texts together finds both: they are
    its two nearest by far (cosine ~0.7 against ~0.1), mostly in two different lists."""
    ctx = WorkerContext.build(settings.model_copy(update={"ivf_search_share": share}))
    out = []
    try:
        for i in range(0, 40, 2):
            query = f"{texts[i]} {texts[i + 1]}"
            deadline = time.time() + 10
            job = SearchJob(job_id=f"j{i}", namespaces=[NS], query=query, hops=0, deadline=deadline)
            reply = retrieve.handle(ctx, job)
            assert reply is not None and reply.ok, reply
            contents = {h.content for h in reply.hits}
            out.append({texts[i], texts[i + 1]} <= contents)
    finally:
        ctx.close()
    return out


def test_a_search_scans_its_share_of_the_lists_not_just_nprobe(stored):
    settings, texts = stored
    assert all(found_both(settings, texts, 1.0))  # every list: both, every time
    assert not all(found_both(settings, texts, 0.0))  # one list (ZQ_IVF_NPROBE=1): not always
