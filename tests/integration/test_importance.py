"""Importance through real Redis and real ingest: PageRank + decay + reinforcement written back
as one field, audited once per run, only for namespaces that changed."""

from __future__ import annotations

import msgpack

from tests.conftest import drain_all
from worker.organise.importance import AUDIT_DELTA, importance_namespace
from worker.organise.periodic import last_runs, run_periodic
from worker.store import notes
from worker.store.integrity import check_namespace

SOLAR = [
    "The project Apollo builds a dashboard for tracking solar panel efficiency.",
    "Postgres stores the solar panel readings every minute.",
    "Solar panel readings arrive from the inverters over MQTT.",
    "The inverters push solar panel readings to Postgres through MQTT.",
    "Lunch on Friday is pizza.",
]


def importance(ctx, ns, nid) -> float:
    return float(ctx.redis.hget(ctx.keys.note(ns, nid), "importance"))


def audit_entries(ctx, ns, op):
    return [e for _, e in ctx.redis.xrange(ctx.keys.audit(ns)) if e[b"op"] == op.encode()]


def test_importance_is_written_back_in_range_and_audited_once_per_run(ctx, client):
    ids = client.store_many(SOLAR, namespace="imp")
    drain_all(ctx)
    before = notes.read_notes(ctx.redis, ctx.keys, "imp", ids)

    written = importance_namespace(ctx, "imp")

    after = notes.read_notes(ctx.redis, ctx.keys, "imp", ids)
    assert written == len(ids)
    values = {nid: importance(ctx, "imp", nid) for nid in ids}
    assert all(0.0 <= v <= 1.0 for v in values.values())
    linked = ctx.redis.hlen(ctx.keys.links("imp", ids[3]))
    assert linked > 0 and values[ids[3]] > values[ids[4]]  # a linked note beats the loner
    for nid in ids:  # only the importance fields changed
        changed = {k for k in after[nid] if after[nid][k] != before[nid].get(k)}
        assert changed <= {b"importance", b"importance_auto", b"importance_prior"}
    (entry,) = audit_entries(ctx, "imp", "importance")
    assert entry[b"id"] == b"*" and entry[b"source"] == b"importance"
    moved_before = msgpack.unpackb(entry[b"before"])
    moved_after = msgpack.unpackb(entry[b"after"])
    assert set(moved_before) == set(moved_after) <= set(ids)
    for nid, value in moved_after.items():
        assert abs(value - moved_before[nid]) > AUDIT_DELTA and value == values[nid]
    assert check_namespace(ctx, "imp") == []


def test_a_second_run_writes_nothing_and_unchanged_namespaces_are_skipped(ctx, client):
    ids = client.store_many(SOLAR, namespace="imp")
    drain_all(ctx)
    assert run_periodic(ctx, "importance") == len(ids)
    assert importance_namespace(ctx, "imp") == 0
    assert run_periodic(ctx, "importance") == 0  # the productive run's second look
    assert run_periodic(ctx, "importance") == 0
    assert last_runs(ctx)["importance"].namespaces == 0  # not due: nothing was written since
    assert len(audit_entries(ctx, "imp", "importance")) == 1
    assert "importance" in client.stats("imp").last


def test_retrievals_and_a_new_hint_raise_importance(ctx, client):
    ids = client.store_many(SOLAR, namespace="imp")
    drain_all(ctx)
    importance_namespace(ctx, "imp")
    first = {nid: importance(ctx, "imp", nid) for nid in ids}
    ctx.redis.hincrby(ctx.keys.note("imp", ids[0]), "access_count", 20)
    client.store(SOLAR[4], namespace="imp", id=ids[4], importance=0.95)
    drain_all(ctx)

    run_periodic(ctx, "importance")

    assert importance(ctx, "imp", ids[0]) > first[ids[0]]
    assert importance(ctx, "imp", ids[4]) > first[ids[4]] + 0.15
    prior = ctx.redis.hget(ctx.keys.note("imp", ids[4]), "importance_prior")
    assert float(prior) == 0.95


def test_tombstoned_notes_are_left_alone(ctx, client):
    ids = client.store_many(SOLAR, namespace="imp")
    client.delete(ids[1], namespace="imp")
    drain_all(ctx)

    importance_namespace(ctx, "imp")

    status = ctx.redis.hget(ctx.keys.note("imp", ids[1]), "status")
    assert status == b"tombstoned"
    assert ctx.redis.hget(ctx.keys.note("imp", ids[1]), "importance_auto") is None
