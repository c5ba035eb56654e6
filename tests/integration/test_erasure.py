"""delete() erases: the tombstone and the delete's audit entry keep no content, and the periodic
audit job removes the id's earlier audit entries; the audit stream stays bounded by
ZQ_AUDIT_MAX and ZQ_AUDIT_MAX_AGE_S."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest

from producer import MemoryClient, NotFound
from tests.conftest import drain_all, make_settings
from worker.context import WorkerContext
from worker.runtime import organiser
from worker.runtime.organiser import OrganiseServer

NS = "erase"
SECRET = "card 4111 1111 1111 1111 exp 09/29"


def audit_bytes(ctx: WorkerContext, ns: str = NS) -> list[bytes]:
    return [b"".join(k + v for k, v in f.items()) for _, f in ctx.redis.xrange(ctx.keys.audit(ns))]


def run_audit(ctx: WorkerContext, ns: str = NS) -> int:
    (run,) = organiser.organise(ctx, ns, ["audit"], time.time() + 30)
    return run.work


def test_a_delete_erases_the_note_and_the_audit_job_its_history(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    note_id = client.store(SECRET, namespace=NS, tags=["billing"], metadata={"pan": SECRET})
    kept = client.store("an unrelated note that stays", namespace=NS)
    drain_all(ctx)
    client.store(SECRET + " (updated)", id=note_id, namespace=NS)
    drain_all(ctx)
    client.delete(note_id, namespace=NS)
    drain_all(ctx)

    tomb = ctx.redis.hgetall(ctx.keys.note(NS, note_id))
    assert tomb[b"status"] == b"tombstoned"
    assert not {b"content", b"metadata", b"tags", b"keywords", b"context"} & set(tomb)
    assert b"4111" not in b"".join(tomb.values())
    (delete,) = [f for _, f in ctx.redis.xrange(ctx.keys.audit(NS)) if f[b"op"] == b"delete"]
    assert "4111" not in repr(msgpack.unpackb(delete[b"before"], raw=False))
    assert sum(b"4111" in e for e in audit_bytes(ctx)) == 2  # its create and its update

    server = OrganiseServer(ctx).start()
    try:
        done = client.organise(NS, jobs=["audit"])
    finally:
        server.stop()
    assert done.work["audit"] == 2
    assert not any(b"4111" in e for e in audit_bytes(ctx))
    ops = [(f[b"id"].decode(), f[b"op"]) for _, f in ctx.redis.xrange(ctx.keys.audit(NS))]
    assert (note_id, b"delete") in ops and (kept, b"create") in ops
    assert ctx.redis.zcard(ctx.keys.erased(NS)) == 0
    with pytest.raises(NotFound):
        client.get(note_id, namespace=NS)
    assert client.get(kept, namespace=NS).content == "an unrelated note that stays"
    assert run_audit(ctx) == 0  # nothing left to do


def test_a_note_stored_again_after_its_delete_keeps_its_new_history(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    note_id = client.store(SECRET, namespace=NS)
    drain_all(ctx)
    client.delete(note_id, namespace=NS)
    drain_all(ctx)
    client.store("a second life under the same id", id=note_id, namespace=NS)
    drain_all(ctx)
    assert run_audit(ctx) == 1
    assert not any(b"4111" in e for e in audit_bytes(ctx))
    assert any(b"a second life" in e for e in audit_bytes(ctx))
    assert client.get(note_id, namespace=NS).content == "a second life under the same id"


def test_erasure_stays_inside_its_namespace(ctx: WorkerContext, client: MemoryClient) -> None:
    mine = client.store(SECRET, namespace=NS)
    theirs = client.store(SECRET, id=mine, namespace="other")  # the same id elsewhere
    drain_all(ctx)
    client.delete(mine, namespace=NS)
    drain_all(ctx)
    run_audit(ctx)
    assert client.get(theirs, namespace="other").content == SECRET
    assert any(b"4111" in e for e in audit_bytes(ctx, "other"))


def test_the_audit_stream_is_trimmed_by_length_and_age(tmp_path: Path, redis_db: object) -> None:
    settings = make_settings(tmp_path, audit_max=10)
    ctx = WorkerContext.build(settings)
    try:
        with MemoryClient(settings) as client:
            client.store_many([f"note number {i}" for i in range(30)], namespace=NS)
            drain_all(ctx)
            assert ctx.redis.xlen(ctx.keys.audit(NS)) == 30
            assert run_audit(ctx) == 20
            assert ctx.redis.xlen(ctx.keys.audit(NS)) == 10
    finally:
        ctx.close()
    settings = make_settings(tmp_path, audit_max=0, audit_max_age_s=0.5)
    ctx = WorkerContext.build(settings)
    try:
        with MemoryClient(settings) as client:
            client.store_many([f"old note {i}" for i in range(5)], namespace=NS)
            drain_all(ctx)
            time.sleep(0.6)
            client.store_many([f"new note {i}" for i in range(3)], namespace=NS)
            drain_all(ctx)
            assert run_audit(ctx) == 5
            assert all(b"new note" in e for e in audit_bytes(ctx))
    finally:
        ctx.close()
