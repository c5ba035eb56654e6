"""``zettelq top`` reads Redis only: backlog per shard rises with queued stores and falls when
they are organised, jobs/s and the shard counters move, search servers report their last
minute, it says so when no worker is alive, and garbage in Redis does not crash it."""

from __future__ import annotations

import json
import time

from producer import MemoryClient
from tests.conftest import drain_all
from tests.integration.test_cli import assert_one_error_line, zettelq
from worker.cli.top import read_frame, with_rates
from worker.context import WorkerContext
from worker.runtime.heartbeat import ProcessHeartbeat
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings

NS = "top"


def top_json(*args: str) -> dict:
    out = zettelq("top", "--once", "--json", *args)
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    return json.loads(line)


def test_backlog_rises_and_falls_and_jobs_are_counted(
    cli_env: WorkerSettings, ctx: WorkerContext, client: MemoryClient
) -> None:
    shard = ctx.keys.shard_of(NS)
    client.store_many([f"queued note {i}" for i in range(7)], namespace=NS)
    frame = top_json("-n", NS)
    assert frame["shards"][shard]["backlog"] == 7
    assert frame["namespace"]["notes"] == 0
    assert "no live worker or searcher process" in frame["warnings"][0]
    before = read_frame(ctx.redis, ctx.keys)
    drain_all(ctx)
    after = with_rates(read_frame(ctx.redis, ctx.keys), before)
    assert after.shards[shard].backlog == 0
    assert after.shards[shard].jobs == before.shards[shard].jobs + 7
    assert after.shards[shard].jobs_per_s is not None and after.shards[shard].jobs_per_s > 0
    assert top_json("-n", NS)["namespace"]["notes"] == 7


def test_live_processes_and_search_servers_show_with_their_numbers(
    cli_env: WorkerSettings, ctx: WorkerContext, client: MemoryClient
) -> None:
    heartbeat = ProcessHeartbeat(cli_env, "worker", consumer=ctx.consumer).start()
    server = SearchServer(ctx).start()
    try:
        client.store("a note to search for", namespace=NS)
        drain_all(ctx)
        for _ in range(5):
            client.search("note to search", namespace=NS)
        time.sleep(0.8)  # a search heartbeat (every 0.5 s) writes the last minute's numbers
        frame = top_json()
        assert frame["warnings"] == []
        assert [p["role"] for p in frame["processes"]] == ["worker"]
        (searcher,) = frame["searchers"]
        assert searcher["consumer"] == ctx.consumer and searcher["searches"] == 5
        assert 0 < searcher["p50_ms"] <= searcher["p99_ms"]
        table = zettelq("top", "--once")
        assert table.returncode == 0, table.stderr
        for heading in ("processes", "shards", "searches", "dead letters", "periodic jobs"):
            assert heading in table.stdout
    finally:
        server.stop()
        heartbeat.stop()


def test_garbage_in_redis_does_not_crash_it(cli_env: WorkerSettings, ctx: WorkerContext) -> None:
    ctx.redis.hset(ctx.keys.runs(), mapping={"merge": b"\xff not json", "evict": b"[1, 2]"})
    ctx.redis.zadd(ctx.keys.searchers(), {"odd": 1})
    ctx.redis.hset(ctx.keys.search_stats("odd"), mapping={"searches": "many", "p50_ms": "x"})
    ctx.redis.set(ctx.keys.lease(0), b"\xfe\xff/token")
    frame = top_json()
    assert frame["runs"] == {}
    assert frame["searchers"][0]["searches"] == 0
    assert zettelq("top", "--once").returncode == 0


def test_bad_arguments_are_one_line(cli_env: WorkerSettings) -> None:
    assert "--interval" in assert_one_error_line(zettelq("top", "--once", "--interval", "0"), 2)
    assert "namespace" in assert_one_error_line(zettelq("top", "--once", "-n", "bad{ns}"), 2)
