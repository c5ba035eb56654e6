"""The degree cap with a real `zettelq worker` process: a hub every new note wants to link to
keeps at most ZQ_MAX_DEGREE links; each link dropped for it leaves both sides and is audited
with its reason and label."""

from __future__ import annotations

import msgpack
import pytest

from producer import MemoryClient
from tests.e2e.workers import running, wait_until
from worker.context import WorkerContext
from worker.store.degree import DEGREE_CAP
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

NS = "hubs"
CAP = 3


def test_a_hub_keeps_at_most_max_degree_links(settings, ctx: WorkerContext):
    hub = "The shard inbox of zettelq is a Redis stream read through a consumer group."
    spokes = [
        f"The shard inbox Redis stream of zettelq is read through consumer group {i}."
        for i in range(10)
    ]
    with running(settings, ZQ_MAX_DEGREE=str(CAP)), MemoryClient(settings) as mem:
        ids = [mem.store(hub, namespace=NS, agent="hub")]
        wait_until(lambda: mem.stats(NS).notes == 1)
        for i, text in enumerate(spokes):  # one batch each, so existing links get dropped
            ids.append(mem.store(text, namespace=NS, agent=f"a{i}"))
            wait_until(lambda n=i + 2: mem.stats(NS).notes == n and mem.stats(NS).pending == 0)
        stats = mem.stats(NS)
        degrees = {nid: len(mem.get(nid, namespace=NS).links) for nid in ids}

    assert max(degrees.values()) == CAP, degrees
    assert check_namespace(ctx, NS) == []
    assert stats.links == sum(degrees.values()) // 2
    drops = [
        e for _, e in ctx.redis.xrange(ctx.keys.audit(NS)) if e[b"source"] == DEGREE_CAP.encode()
    ]
    assert drops and all(e[b"op"] == b"unlink" for e in drops)
    for entry in drops:
        ((gone, (_, reason, label)),) = msgpack.unpackb(entry[b"before"])["links"].items()
        assert reason and label  # the dropped link's metadata, read with the link counts
        a = entry[b"id"].decode()
        assert gone not in mem_links(ctx, a) and a not in mem_links(ctx, gone)
    assert int(ctx.redis.hget(ctx.keys.stats(NS), "links_capped")) >= len(drops)


def mem_links(ctx: WorkerContext, nid: str) -> set[str]:
    return {m.decode() for m in ctx.redis.hkeys(ctx.keys.links(NS, nid))}
