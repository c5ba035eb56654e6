"""Fault injection: poison jobs placed straight into a shard stream, amid good jobs, reach a
real worker. Each is dead-lettered with its reason, the good batch-mates are organised, the
worker keeps running, and `zettelq dead list|retry|purge` inspects, replays and drops them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import msgpack
import pytest

from producer import MemoryClient
from tests.e2e.workers import running, wait_until, worker_env
from worker.context import WorkerContext
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

NS = "poison"


def _job(**overrides: object) -> bytes:
    job: dict[str, object] = {
        "v": 1,
        "op": "store",
        "id": "placeholder",
        "ns": NS,
        "content": "a good note about poison handling",
        "created_at": time.time(),
    }
    job.update(overrides)
    return msgpack.packb(job, use_bin_type=True)


#: payload -> the words its dead-letter reason must contain
POISON = {
    "malformed": (b"\xc1\xff not msgpack at all", "cannot decode"),
    "version": (_job(id="p-version", v=99), "protocol version 99"),
    "wrong-type": (_job(id="p-type", content=12345), "cannot decode StoreJob"),
    "oversized": (_job(id="p-big", content="x" * 40_000), "limit is 32768"),
    "bad-namespace": (_job(id="p-ns", ns="has{braces}"), "namespace must be"),
    "unknown-op": (_job(id="p-op", op="explode"), "cannot decode DeleteJob"),
}


def _dead(settings: WorkerSettings, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "worker.cli.main", "dead", *args],
        env=worker_env(settings),
        capture_output=True,
        check=True,
        timeout=30,
    )
    return out.stdout.decode()


def _seed(ctx: WorkerContext) -> list[str]:
    """Good and poison entries interleaved in one shard stream, before any worker runs."""
    inbox = ctx.keys.inbox(ctx.keys.shard_of(NS))
    good = []
    for i, (payload, _) in enumerate(POISON.values()):
        nid = f"good-{i}"
        ctx.redis.xadd(inbox, {"j": _job(id=nid, content=f"good note {i} about poison jobs")})
        ctx.redis.xadd(inbox, {"j": payload})
        good.append(nid)
    ctx.redis.xadd(inbox, {"x": b"an entry without a job field"})
    return good


def test_poison_jobs_are_dead_lettered_and_batch_mates_organised(own_settings, own_ctx):
    good = _seed(own_ctx)
    with running(own_settings) as (worker,), MemoryClient(own_settings) as mem:
        wait_until(lambda: mem.stats(NS).pending == 0, timeout_s=30)
        assert mem.stats(NS).notes == len(good)
        for nid in good:
            assert mem.get(nid, namespace=NS).content.startswith("good note")
        rows = [
            json.loads(line)
            for line in _dead(own_settings, "list", "--count", "50", "--json").splitlines()
        ]
        assert len(rows) == len(POISON) + 1
        reasons = [r["reason"] for r in rows]
        for _, words in POISON.values():
            assert any(words in r for r in reasons), f"no reason mentions {words!r}: {reasons}"
        assert any("no 'j' field" in r for r in reasons)
        assert worker.poll() is None, "poison must not stop the worker"
        after = mem.store("stored after the poison", namespace=NS)
        mem.flush(NS)
        assert mem.get(after, namespace=NS).content == "stored after the poison"


def test_dead_retry_replays_after_the_limit_is_raised_and_purge_drops(
    tmp_path, own_settings, own_ctx
):
    """A job a worker refused under a tighter limit is replayed once the limit is raised."""
    inbox = own_ctx.keys.inbox(own_ctx.keys.shard_of(NS))
    own_ctx.redis.xadd(inbox, {"j": _job(id="long-one", content="y" * 2_000)})
    own_ctx.redis.xadd(inbox, {"j": POISON["malformed"][0]})
    with MemoryClient(own_settings) as mem:
        with running(own_settings, ZQ_MAX_CONTENT_BYTES="1000"):
            wait_until(lambda: own_ctx.redis.xlen(own_ctx.keys.dead()) == 2, timeout_s=30)
        assert mem.stats(NS).notes == 0 and mem.stats(NS).dead == 1  # the other names no ns
        assert "requeued 1" in _dead(own_settings, "retry", "--count", "1")
        with running(own_settings):
            wait_until(lambda: mem.stats(NS).notes == 1, timeout_s=30)
            assert len(mem.get("long-one", namespace=NS).content) == 2_000
            wait_until(lambda: mem.stats(NS).pending == 0, timeout_s=30)
    assert "purged 1" in _dead(own_settings, "purge")
    assert own_ctx.redis.xlen(own_ctx.keys.dead()) == 0
