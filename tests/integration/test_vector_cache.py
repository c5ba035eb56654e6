"""The vector cache: a text is embedded once per embedder, whatever namespace or id stores it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from producer import MemoryClient
from tests.conftest import drain_all, make_settings
from worker.context import WorkerContext
from worker.models.hashing import HashingEmbedder
from worker.models.vector_cache import embed_cached


class CountingEmbedder:
    """A hashing embedder that records every text it is asked to embed."""

    def __init__(self, dim: int = 64) -> None:
        self._inner = HashingEmbedder(dim)
        self.name = self._inner.name
        self.dim = dim
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(list(texts))
        return self._inner.embed(texts)


def counting_ctx(tmp_path, **overrides: object) -> WorkerContext:
    ctx = WorkerContext.build(make_settings(tmp_path, **overrides))
    ctx.embedder = CountingEmbedder()
    return ctx


@pytest.fixture
def cctx(redis_db, tmp_path) -> Iterator[WorkerContext]:
    ctx = counting_ctx(tmp_path, vector_cache_ttl_s=3600)
    yield ctx
    ctx.close()


def embedded(ctx: WorkerContext) -> list[str]:
    assert isinstance(ctx.embedder, CountingEmbedder)
    return [text for call in ctx.embedder.calls for text in call]


def test_storing_the_same_content_again_does_not_call_the_embedder(cctx):
    with MemoryClient(cctx.settings) as mem:
        first = mem.store("Postgres replicas lag during the nightly vacuum", namespace="a")
        drain_all(cctx)
        assert embedded(cctx) == ["Postgres replicas lag during the nightly vacuum"]
        again = mem.store("Postgres replicas lag during the nightly vacuum", namespace="a")
        other_ns = mem.store("Postgres replicas lag during the nightly vacuum", namespace="b")
        drain_all(cctx)
    assert len(cctx.embedder.calls) == 1  # type: ignore[attr-defined]
    vecs = [
        cctx.redis.hget(cctx.keys.note(ns, nid), "vec")
        for ns, nid in [("a", first), ("a", again), ("b", other_ns)]
    ]
    assert vecs[0] == vecs[1] == vecs[2]


def test_duplicates_within_a_batch_are_embedded_once_and_misses_in_one_call(cctx):
    with MemoryClient(cctx.settings) as mem:
        mem.store("cached already", namespace="a")
        drain_all(cctx)
        mem.store_many(["same text", "same text", "cached already", "other text"], namespace="a")
        drain_all(cctx)
    assert cctx.embedder.calls == [["cached already"], ["same text", "other text"]]  # type: ignore[attr-defined]


def test_entries_expire_after_the_configured_ttl(redis_db, tmp_path):
    ctx = counting_ctx(tmp_path, vector_cache_ttl_s=120)
    try:
        embed_cached(ctx, ["expiring"])
        (key,) = ctx.redis.keys(f"{ctx.keys.prefix}:vcache:*")
        assert key.decode().startswith(f"{ctx.keys.prefix}:vcache:hash-v1-d64:")
        assert 110 <= ctx.redis.ttl(key) <= 120
    finally:
        ctx.close()


def test_ttl_zero_turns_the_cache_off(redis_db, tmp_path):
    ctx = counting_ctx(tmp_path, vector_cache_ttl_s=0)
    try:
        embed_cached(ctx, ["uncached"])
        embed_cached(ctx, ["uncached"])
        assert embedded(ctx) == ["uncached", "uncached"]
        assert ctx.redis.keys(f"{ctx.keys.prefix}:vcache:*") == []
    finally:
        ctx.close()


def test_another_embedder_never_reads_these_entries(cctx):
    embed_cached(cctx, ["shared text"])
    cctx.embedder = HashingEmbedder(32)
    vec = embed_cached(cctx, ["shared text"])
    assert vec.shape == (1, 32)
    assert np.allclose(vec, HashingEmbedder(32).embed(["shared text"]))


def test_a_cached_vector_equals_a_fresh_one_and_a_damaged_entry_is_a_miss(cctx):
    fresh = embed_cached(cctx, ["hello vectors", "second"])
    cached = embed_cached(cctx, ["second", "hello vectors"])
    assert np.array_equal(cached, fresh[::-1])
    (key,) = [
        k
        for k in cctx.redis.keys(f"{cctx.keys.prefix}:vcache:*")
        if np.array_equal(np.frombuffer(cctx.redis.get(k), np.float32), fresh[1])
    ]
    cctx.redis.set(key, b"short")
    assert np.array_equal(embed_cached(cctx, ["second"]), fresh[1:])
    assert embedded(cctx)[-1] == "second"


def test_the_cache_defaults_to_off_for_the_hashing_embedder_and_on_for_a_model(tmp_path):
    assert make_settings(tmp_path).vector_cache_ttl_for == 0
    assert make_settings(tmp_path, embedder="minilm").vector_cache_ttl_for == 7 * 86_400
