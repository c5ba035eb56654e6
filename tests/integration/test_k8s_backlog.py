"""The KEDA ScaledObject of deploy/k8s/keda/ follows the real backlog on a real Redis: each trigger
read the way its scaler reads it (redis-streams without consumerGroup: XLEN; redis: LLEN), the
formula rises on a burst of stores and returns to 0 once the real drain code has organised it,
poison job included, so the workers can scale to zero. XPENDING, meanwhile, reads 0."""

from __future__ import annotations

import math
from typing import Any

from redis import Redis

from producer import MemoryClient
from producer.keys import Keys
from tests.conftest import drain_all, make_settings
from tests.k8s import desired_workers, evaluate, formula, objects, one
from worker.context import WorkerContext
from worker.intake.dispatch import GROUP
from worker.intake.drain import ensure_group

NAMESPACES = [f"team-{i}" for i in range(16)]
PER_NAMESPACE = 150


def manifest() -> tuple[dict[str, Any], Keys]:
    (so,) = objects("ScaledObject")
    env = one("ConfigMap", "zettelq")["data"]
    return so, Keys(env["ZQ_KEY_PREFIX"], int(env["ZQ_SHARD_COUNT"]))


def trigger_values(
    redis: Redis, so: dict[str, Any], manifest_keys: Keys, keys: Keys
) -> dict[str, float]:
    """Each trigger's metric as KEDA's scaler reads it, on the keys of this test's prefix."""
    values = {}
    for trigger in so["spec"]["triggers"]:
        meta = trigger["metadata"]
        key = meta["stream"] if trigger["type"] == "redis-streams" else meta["listName"]
        assert key.startswith(f"{manifest_keys.prefix}:")
        key = keys.prefix + key[len(manifest_keys.prefix) :]
        if trigger["type"] == "redis-streams":
            values[trigger["name"]] = float(redis.xlen(key))  # 0 for a missing stream
        else:
            assert redis.type(key) in (b"list", b"none")
            values[trigger["name"]] = float(redis.llen(key))
    return values


def client_stats(settings) -> list[int]:
    with MemoryClient(settings) as client:
        return [client.stats(ns).notes for ns in NAMESPACES]


def test_the_scaling_metric_rises_on_a_burst_and_returns_to_zero_when_drained(
    redis_db: Redis, tmp_path
) -> None:
    so, manifest_keys = manifest()
    settings = make_settings(tmp_path, shard_count=manifest_keys.shard_count)
    ctx = WorkerContext.build(settings)
    try:
        keys = ctx.keys
        assert trigger_values(ctx.redis, so, manifest_keys, keys) == dict.fromkeys(
            [t["name"] for t in so["spec"]["triggers"]], 0.0
        )
        assert desired_workers(so, trigger_values(ctx.redis, so, manifest_keys, keys)) == 0

        with MemoryClient(settings) as client:
            for ns in NAMESPACES:
                client.store_many(
                    [f"{ns} fact {i} about topic {i % 11}" for i in range(PER_NAMESPACE)],
                    namespace=ns,
                )
        poisoned = keys.shard_of(NAMESPACES[0])
        ctx.redis.xadd(keys.inbox(poisoned), {"x": b"an entry without a job field"})

        burst = trigger_values(ctx.redis, so, manifest_keys, keys)
        shards = {keys.shard_of(ns) for ns in NAMESPACES}
        assert (
            sum(burst[f"shard{n}"] for n in range(keys.shard_count))
            == len(NAMESPACES) * PER_NAMESPACE + 1
        )
        value = evaluate(formula(so), burst)
        target = float(so["spec"]["advanced"]["scalingModifiers"]["target"])
        assert value > 0
        wanted = desired_workers(so, burst)
        assert wanted == math.ceil(value / target)
        assert 1 <= wanted <= len(shards), "never more workers than shards with work"

        for shard in range(keys.shard_count):  # what a consumerGroup trigger would read
            ensure_group(ctx, shard)
            assert ctx.redis.xpending(keys.inbox(shard), GROUP)["pending"] == 0

        assert drain_all(ctx) == len(NAMESPACES) * PER_NAMESPACE + 1  # the poison job too
        assert sum(client_stats(settings)) == len(NAMESPACES) * PER_NAMESPACE
        drained = trigger_values(ctx.redis, so, manifest_keys, keys)
        assert set(drained.values()) == {0.0}
        assert evaluate(formula(so), drained) == 0
        assert desired_workers(so, drained) == 0, "inactive: the workers scale to zero"
        assert ctx.redis.xlen(keys.dead()) == 1

        with MemoryClient(settings) as client:
            client.organise(NAMESPACES[0], wait=False)
        assert desired_workers(so, trigger_values(ctx.redis, so, manifest_keys, keys)) == 1
    finally:
        ctx.close()
