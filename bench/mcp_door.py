"""What the MCP door adds to a store: store() latency direct vs through the MCP server.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/mcp_door.py`` (about a minute).
Uses the Redis at ``--redis`` (default ``redis://127.0.0.1:6379/7``) under a key prefix of its
own and deletes its keys at the end. No worker runs: a store never waits for one, so this is
the producer's cost alone, as the agent sees it.

In each round, in this order, ``--calls`` stores (after ``--warmup`` untimed ones) of a ~200 B
note, one at a time, each timed from the call to its return:

1. ``direct``: ``AsyncMemoryClient.store()`` (the baseline);
2. ``mcp memory``: ``memory_store`` through the SDK's in-memory ``Client(server)`` (the same
   process: the cost of the MCP layers, JSON-RPC and validation, without a transport);
3. ``mcp http``: ``memory_store`` through the SDK's streamable-HTTP client to a
   ``zettelq mcp --http`` subprocess on 127.0.0.1 with a bearer token (one session: every call
   pays a token check, one HTTP request and an SSE reply).

Rounds interleave the doors so that a change of load moves all three alike. The table gives
each door's p50 and p99 over every round, and its p50 as a ratio to the direct p50 of the same
run (and the difference in ms).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from redis import Redis

from producer import AsyncMemoryClient, ProducerSettings
from producer.adapters.mcp import build_server
from producer.adapters.tokens import TokenStore
from worker.runtime.devserver import free_port

ROOT = Path(__file__).resolve().parents[1]  #: repo root, the server's working directory
NAMESPACE = "bench-mcp"  #: the one namespace every note goes to
NOTE = "The deploy key of the staging cluster rotates every ninety days; " * 3  #: ~200 B
START_TIMEOUT_S = 30.0  #: how long the HTTP server may take to answer /health

Store = Callable[[int], Awaitable[object]]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(store: Store, calls: int, warmup: int) -> list[float]:
    """Seconds of each of ``calls`` stores, after ``warmup`` untimed ones."""
    for i in range(warmup):
        await store(i)
    out = []
    for i in range(calls):
        start = time.perf_counter()
        await store(i)
        out.append(time.perf_counter() - start)
    return out


@contextmanager
def http_server(url: str, prefix: str) -> Iterator[str]:
    """``zettelq mcp --http`` in a subprocess on a free port; yields its base URL."""
    port = free_port()
    env = {**os.environ, "ZQ_REDIS_URL": url, "ZQ_KEY_PREFIX": prefix}
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "mcp", "--http", "--port", str(port)],
        env=env,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                if httpx2.get(f"{base}/health").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("zettelq mcp --http did not start")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(15)


async def measure(
    settings: ProducerSettings, base: str, secret: str, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Per door, the latencies of every round."""
    results: dict[str, list[float]] = {"direct": [], "mcp memory": [], "mcp http": []}
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        AsyncMemoryClient(settings) as memory,
        Client(build_server(memory, NAMESPACE)) as in_memory,
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http)) as over_http,
    ):

        async def direct(i: int) -> object:
            return await memory.store(NOTE, namespace=NAMESPACE)

        async def via_memory(i: int) -> object:
            return await in_memory.call_tool("memory_store", {"content": NOTE})

        async def via_http(i: int) -> object:
            return await over_http.call_tool("memory_store", {"content": NOTE})

        doors: dict[str, Store] = {"direct": direct, "mcp memory": via_memory, "mcp http": via_http}
        for _ in range(args.rounds):
            for name, store in doors.items():
                results[name] += await timed(store, args.calls, args.warmup)
    return results


def report(results: dict[str, list[float]]) -> None:
    base = pct(results["direct"], 0.5)
    print("| door | stores | p50 ms | p99 ms | p50 / direct p50 | p50 added ms |")
    print("|---|---|---|---|---|---|")
    for name, lat in results.items():
        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
        added = (p50 - base) * 1000
        print(
            f"| {name} | {len(lat):,} | {p50 * 1000:.3f} | {p99 * 1000:.3f} | "
            f"{p50 / base:.2f}x | {added:+.3f} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/7")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1_000, help="timed stores per door and round")
    p.add_argument("--warmup", type=int, default=100, help="untimed stores before each series")
    args = p.parse_args()
    prefix = f"bmcp{uuid.uuid4().hex[:6]}"
    settings = ProducerSettings(redis_url=args.redis, key_prefix=prefix)
    tokens = TokenStore.from_settings(settings)
    secret, _ = tokens.create(read=[NAMESPACE], write=[NAMESPACE], label="bench")
    try:
        with http_server(args.redis, prefix) as base:
            results = asyncio.run(measure(settings, base, secret, args))
        report(results)
    finally:
        tokens.close()
        redis = Redis.from_url(args.redis)
        keys = list(redis.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            redis.delete(*keys)
        redis.close()


if __name__ == "__main__":
    main()
