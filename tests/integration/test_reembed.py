"""Changing the embedder: indexes never mix two models' vectors, and reembed moves a namespace
over to the new model atomically per batch, audited, while writes carry on."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import msgpack
import numpy as np
import numpy.typing as npt
import pytest

from producer import MemoryClient
from tests.conftest import drain_all
from worker.cli.main import main
from worker.context import WorkerContext
from worker.index.projection import catch_up
from worker.models.hashing import HashingEmbedder
from worker.organise.reembed import reembed_namespace
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace

NS = "migrate"
OLD, NEW = "hash-v1-d256", "hash-v1-d64"
NOTES = [
    *(f"note {i}: step {i} of the kafka runbook" for i in range(12)),
    "Snowflake key-pair auth rotates every 90 days",
    "The cafeteria serves lentil soup on Fridays",
]


@pytest.fixture
def stored(settings) -> list[str]:
    """NOTES organised by a worker with the default 256-d hashing embedder."""
    old = WorkerContext.build(settings)
    try:
        with MemoryClient(settings) as mem:
            ids = mem.store_many(NOTES, namespace=NS)
        drain_all(old)
        assert old.embedder.name == OLD
    finally:
        old.close()
    return ids


@pytest.fixture
def new_ctx(settings) -> Iterator[WorkerContext]:
    """A worker whose embedder changed to a 64-d one (a different name)."""
    ctx = WorkerContext.build(settings.model_copy(update={"dense_weight": 0.5}))
    ctx.embedder = HashingEmbedder(64)
    yield ctx
    ctx.close()


def embedders(ctx: WorkerContext) -> dict[str, str]:
    ids = [m.decode() for m in ctx.redis.zrange(ctx.keys.active(NS), 0, -1)]
    return {nid: ctx.redis.hget(ctx.keys.note(NS, nid), "embedder").decode() for nid in ids}


def test_a_worker_with_another_embedder_leaves_old_vectors_out_of_its_index(stored, new_ctx):
    proj = new_ctx.projection(NS)
    assert len(proj.index) == 0 and proj.index.dim == 64


def test_reembed_moves_every_note_to_the_new_model_and_search_works(stored, new_ctx):
    assert reembed_namespace(new_ctx, NS, batch=5) == len(NOTES)
    assert set(embedders(new_ctx).values()) == {NEW}
    for nid, text in zip(stored, NOTES, strict=True):
        vec = np.frombuffer(new_ctx.redis.hget(new_ctx.keys.note(NS, nid), "vec"), np.float32)
        assert np.allclose(vec, new_ctx.embedder.embed([text])[0])
    proj = new_ctx.projection(NS)
    assert len(proj.index) == len(NOTES)
    assert check_namespace(new_ctx, NS) == []
    server = SearchServer(new_ctx).start()
    try:
        with MemoryClient(new_ctx.settings) as mem:
            hits = mem.search("Snowflake key rotation", namespace=NS, k=1)
    finally:
        server.stop()
    assert hits[0].id == stored[-2]
    assert reembed_namespace(new_ctx, NS) == 0  # nothing left to do


def test_every_reembedded_note_has_an_audit_entry_and_a_change_log_entry(stored, new_ctx):
    before = new_ctx.redis.xlen(new_ctx.keys.changes(NS))
    reembed_namespace(new_ctx, NS, batch=5)
    entries = [f for _, f in new_ctx.redis.xrange(new_ctx.keys.audit(NS)) if f[b"op"] == b"reembed"]
    assert sorted(f[b"id"].decode() for f in entries) == sorted(stored)
    assert all(msgpack.unpackb(f[b"before"]) == {"embedder": OLD} for f in entries)
    assert all(msgpack.unpackb(f[b"after"]) == {"embedder": NEW} for f in entries)
    assert new_ctx.redis.xlen(new_ctx.keys.changes(NS)) == before + 3  # one per batch of 5
    assert float(new_ctx.redis.hget(new_ctx.keys.stats(NS), "last_reembed")) > 0


def test_a_worker_still_on_the_old_model_drops_the_reembedded_notes(stored, settings, new_ctx):
    old = WorkerContext.build(settings)
    try:
        proj = old.projection(NS)
        assert len(proj.index) == len(NOTES)
        reembed_namespace(new_ctx, NS)
        with proj.lock:
            catch_up(old, proj)
        assert len(proj.index) == 0  # never a 64-d vector in a 256-d index, nor a stale one
    finally:
        old.close()


def test_a_restore_of_unchanged_content_by_the_new_worker_gets_a_new_model_vector(stored, new_ctx):
    with MemoryClient(new_ctx.settings) as mem:
        mem.store(NOTES[0], namespace=NS, id=stored[0])
    drain_all(new_ctx)
    assert embedders(new_ctx)[stored[0]] == NEW
    assert len(new_ctx.redis.hget(new_ctx.keys.note(NS, stored[0]), "vec")) == 64 * 4
    assert len(new_ctx.projection(NS).index) == 1
    assert reembed_namespace(new_ctx, NS) == len(NOTES) - 1


class ConcurrentWriter:
    """A 64-d embedder during whose first call someone rewrites a note's content."""

    def __init__(self, ctx: WorkerContext, note_id: str) -> None:
        self._inner = HashingEmbedder(64)
        self.name, self.dim = self._inner.name, 64
        self._ctx, self._note_id, self.calls = ctx, note_id, 0

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += 1
        if self.calls == 1:
            self._ctx.redis.hset(self._ctx.keys.note(NS, self._note_id), "content", "rewritten")
        return self._inner.embed(texts)


def test_a_note_changed_while_its_batch_was_embedded_is_left_for_the_next_run(stored, new_ctx):
    new_ctx.embedder = ConcurrentWriter(new_ctx, stored[0])
    assert reembed_namespace(new_ctx, NS) == len(NOTES) - 1
    assert embedders(new_ctx)[stored[0]] == OLD
    assert reembed_namespace(new_ctx, NS) == 1
    assert set(embedders(new_ctx).values()) == {NEW}


def test_cli_reembed_wait_runs_it_with_the_environment_settings(
    stored, cli_env, new_ctx, monkeypatch, capsys
):
    monkeypatch.setenv("ZQ_EMBED_DIM", "64")  # the hashing embedder's name changes with it
    assert main(["reembed", NS, "--wait"]) == 0
    assert capsys.readouterr().out.strip() == f"reembedded {len(NOTES)} notes"
    assert set(embedders(new_ctx).values()) == {NEW}
