"""worker.store.migrate: links stored in the layout before 2026-12-01 (a sorted set of weights plus
a linkmeta hash per note) become one links hash per note, byte for byte what the new code writes."""

from __future__ import annotations

import msgpack
import pytest

from producer import MemoryClient
from producer.protocol import unpack_link
from tests.conftest import drain_all
from worker.cli.main import main
from worker.context import WorkerContext
from worker.errors import MigrationRefused
from worker.intake import deadletter
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace
from worker.store.migrate import migrate_links

TEXTS = [
    "The billing service retries failed card payments three times.",
    "Card payments that fail are retried by billing, three attempts.",
    "Billing retries a failed payment up to three times before giving up.",
    "The weekly team meeting moved to Thursday afternoon.",
    "Thursday afternoon is now the slot of the weekly meeting.",
]


def _links_hashes(ctx: WorkerContext, ns: str) -> dict[bytes, dict[bytes, bytes]]:
    keys = ctx.redis.keys(f"{ctx.keys.prefix}:{{{ns}}}:links:*")
    return {k: ctx.redis.hgetall(k) for k in keys}


def _to_old_layout(ctx: WorkerContext, ns: str) -> None:
    """Rewrite every links hash as the old code stored it."""
    for key, packed in _links_hashes(ctx, ns).items():
        meta_key = key.replace(b":links:", b":linkmeta:")
        ends = {nb: unpack_link(raw) for nb, raw in packed.items()}
        ctx.redis.delete(key)
        ctx.redis.zadd(key, {nb: w for nb, (w, _) in ends.items()})
        ctx.redis.hset(meta_key, mapping={nb: msgpack.packb(m) for nb, (_, m) in ends.items()})


def test_old_links_become_the_new_layout_exactly_and_a_second_run_changes_nothing(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    ids = client.store_many(TEXTS, namespace="m1")
    client.store_many(TEXTS, namespace="m2")
    drain_all(ctx)
    before = {ns: _links_hashes(ctx, ns) for ns in ("m1", "m2")}
    assert all(before.values()), "the texts must link"
    for ns in ("m1", "m2"):
        _to_old_layout(ctx, ns)
    orphan = f"{ctx.keys.prefix}:{{m1}}:linkmeta:gone"
    other = f"{ctx.keys.prefix}x:{{m1}}:links:n1"
    ctx.redis.zadd(other, {"n2": 0.5})
    ctx.redis.hset(orphan, "x", msgpack.packb({"reason": "r"}))

    done = migrate_links(ctx)

    assert {ns: _links_hashes(ctx, ns) for ns in ("m1", "m2")} == before
    assert ctx.redis.keys(f"{ctx.keys.prefix}:*linkmeta*") == []
    assert done.notes == sum(len(v) for v in before.values())
    assert done.links == sum(len(h) for v in before.values() for h in v.values())
    assert done.orphans == 1
    assert done.per_namespace == {ns: len(before[ns]) for ns in ("m1", "m2")}
    assert ctx.redis.type(other) == b"zset"  # another deployment's keys are left alone
    assert all(check_namespace(ctx, ns) == [] for ns in ("m1", "m2"))
    assert client.get(ids[0], namespace="m1").links  # the producer reads the migrated links
    again = migrate_links(ctx)
    assert (again.notes, again.links, again.orphans) == (0, 0, 0)


def test_migrate_deletes_the_unused_seq_maps_and_nothing_like_them(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    client.store_many(TEXTS, namespace="s1")
    drain_all(ctx)
    prefix = ctx.keys.prefix
    old = f"{prefix}:{{s1}}:seqs"
    ctx.redis.hset(old, mapping={"1": "a", "2": "b"})  # as builds before 2026-12-07 wrote it
    lookalikes = [f"{prefix}:{{s1}}:note:x}}:seqs", f"{prefix}x:{{s1}}:seqs"]
    for key in lookalikes:
        ctx.redis.hset(key, "1", "a")
    links = _links_hashes(ctx, "s1")

    done = migrate_links(ctx)

    assert done.seq_maps == 1 and not ctx.redis.exists(old)
    assert all(ctx.redis.exists(key) for key in lookalikes)
    assert ctx.redis.get(ctx.keys.seq("s1")) is not None  # the seq counter stays
    assert _links_hashes(ctx, "s1") == links
    assert migrate_links(ctx).seq_maps == 0
    ctx.redis.delete(*lookalikes)


def test_migrate_refuses_while_a_worker_holds_a_shard_lease(
    ctx: WorkerContext, cli_env: WorkerSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx.redis.set(ctx.keys.lease(1), b"someone/token", px=10_000)
    with pytest.raises(MigrationRefused, match="stop every worker"):
        migrate_links(ctx)
    assert main(["migrate"]) == 1  # the command says so and fails
    assert "stop every worker" in capsys.readouterr().err


def test_jobs_dead_lettered_on_old_links_are_organised_after_migrate_and_retry(
    ctx: WorkerContext, client: MemoryClient
) -> None:
    """A worker upgraded before the migration dead-letters the batches that touch old links
    (WRONGTYPE), losing nothing; migrate, then ``dead retry``, organises them."""
    first = client.store_many(TEXTS[:3], namespace="m")
    drain_all(ctx)
    _to_old_layout(ctx, "m")
    later = client.store_many([*TEXTS[3:], TEXTS[0] + " Again."], namespace="m")
    drain_all(ctx)
    dead = ctx.redis.xlen(ctx.keys.dead())
    assert dead > 0
    migrate_links(ctx)
    assert deadletter.retry_dead(ctx, 100) == dead
    drain_all(ctx)
    assert ctx.redis.xlen(ctx.keys.dead()) == 0
    assert all(client.get(nid, namespace="m") for nid in first + later)
    assert check_namespace(ctx, "m") == []
