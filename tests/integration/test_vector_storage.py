"""ZQ_VECTOR_STORAGE=float16 through the real worker code and Redis: every path that writes a
vector (ingest, consolidation, restore) writes the float16 layout, every path that reads one
(search, the projection's rebuild, the pairwise jobs, export) reads it, and a namespace written
under both settings reads as one."""

from __future__ import annotations

import io

import pytest

from producer import MemoryClient
from tests.conftest import drain_all, make_settings
from tests.integration.test_transfer import DATA, DUPLICATE, export_file, organised_conversation
from worker import vectors
from worker.context import WorkerContext
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace
from worker.transfer.importer import import_stream


@pytest.fixture
def settings(redis_db, tmp_path):
    return make_settings(tmp_path, vector_storage="float16")


def stored_dims(ctx: WorkerContext, ns: str) -> dict[str, int]:
    """Active note id -> the length of its stored vector."""
    ids = [m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)]
    return {nid: len(ctx.redis.hget(ctx.keys.note(ns, nid), "vec")) for nid in ids}


@pytest.mark.skipif(not DATA.exists(), reason=f"LoCoMo sample not found at {DATA}")
def test_an_organised_namespace_keeps_float16_vectors_and_reads_them_everywhere(
    settings, ctx, client, server
):
    organised_conversation(ctx, client)  # ingest, then merge, supersede, consolidate, evolve
    dim = ctx.embedder.dim
    lengths = stored_dims(ctx, "src")
    assert set(lengths.values()) == {2 * dim + 1}  # insights of consolidation too
    assert any(client.get(nid, namespace="src").kind == "insight" for nid in lengths)
    assert check_namespace(ctx, "src") == []
    assert client.get("dup-b", namespace="src").id == "dup-a"  # merged by their vectors
    assert client.get("react", namespace="src").superseded_by == "svelte"
    assert client.search("charity race mental health", namespace="src", k=1)[0].id == "dup-a"

    data = export_file(ctx.redis, ctx.keys, "src")
    assert b'"dims": %d' % dim in data.split(b"\n", 1)[0]
    import_stream(settings, "dst", io.BytesIO(data))
    drain_all(ctx)
    assert set(stored_dims(ctx, "dst").values()) == {2 * dim + 1}
    assert client.search(DUPLICATE, namespace="dst", k=1)[0].id == "dup-a"


def test_a_namespace_written_under_both_settings_reads_as_one_after_a_cold_rebuild(
    redis_db, tmp_path
):
    full = make_settings(tmp_path / "a", vector_storage="float32")
    half = full.model_copy(update={"vector_storage": "float16"})
    texts = {
        "float32": ["The cellist tunes her instrument before every rehearsal.", "Rain all week."],
        "float16": ["The cellist bought new strings for her instrument.", "Snow on Friday."],
    }
    ids: dict[str, list[str]] = {}
    for s in (full, half):
        with WorkerContext.build(s) as ctx, MemoryClient(s) as client:
            ids[s.vector_storage] = client.store_many(texts[s.vector_storage], namespace="mixed")
            drain_all(ctx)
    cold = full.model_copy(update={"index_dir": tmp_path / "cold"})  # no snapshot: rebuilt
    with WorkerContext.build(cold) as ctx, MemoryClient(cold) as client:
        dim = ctx.embedder.dim
        lengths = stored_dims(ctx, "mixed")
        assert {lengths[nid] for nid in ids["float32"]} == {4 * dim}
        assert {lengths[nid] for nid in ids["float16"]} == {2 * dim + 1}
        srv = SearchServer(ctx).start()
        try:
            hits = client.search("cellist instrument strings", namespace="mixed", k=2)
        finally:
            srv.stop()
        assert {h.id for h in hits} == {ids["float32"][0], ids["float16"][0]}
        old, new = ids["float32"][0], ids["float16"][0]
        assert new in client.get(old, namespace="mixed").links  # linked across the layouts
        raw = ctx.redis.hget(ctx.keys.note("mixed", new), "vec")
        again = ctx.embedder.embed([texts["float16"][0]])[0]
        assert float(vectors.decode(raw) @ again) == pytest.approx(1.0, abs=1e-3)
