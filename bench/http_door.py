"""The HTTP door's cost: store() latency through ``zettelq serve`` against the direct
MemoryClient in the same run, and stores/s with 4 concurrent clients through each.

Run from the repo root: ``.venv/bin/python bench/http_door.py`` (about a minute).
It starts its own redis-server (worker.runtime.devserver), or uses the one ``--redis`` names,
and ``zettelq serve`` (one uvicorn process, 127.0.0.1) as a subprocess with a fresh key prefix
(whose keys it deletes at the end), and creates one write token. No worker
runs: a store is the producer's cost only (validation, packing, one EVALSHA that XADDs to the shard
stream), and through HTTP also the request, the token check (one HGETALL) and the response.

1. Latency: ``--rounds`` rounds, each of ``--calls`` direct ``MemoryClient.store()`` calls,
   then as many ``POST /v1/namespaces/bench/notes`` on one keep-alive httpx.Client, as many
   on one keep-alive ``http.client.HTTPConnection`` (the standard library's lighter client:
   the difference is httpx's own cost) and as many ``GET /health`` (the HTTP stack with no
   Redis), so every path sees the same load and Redis state; 200 untimed calls of each
   first. p50 and p99 by nearest rank, and the CPU each call cost the bench process (the
   client) and the ``zettelq serve`` process (from /proc), which a busy host inflates less
   than it does the latencies.
2. Throughput: ``--clients`` processes each store ``--seconds`` long back to back, first
   directly, then through HTTP; stores/s is all their stores over the wall time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from redis import Redis

from producer import MemoryClient, ProducerSettings
from producer.adapters.tokens import TokenStore
from worker.runtime.devserver import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parents[1]
NS = "bench"  #: the namespace every store goes to
PATHS = ("direct store()", "HTTP POST notes", "HTTP GET /health")  #: the latency rows
TEXT = "a note of about the size an agent stores: a fact, a decision and why it was taken"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (from /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Samples:
    """One path's call latencies and the CPU both sides spent on them."""

    seconds: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    def run(self, call: Callable[[int], object], count: int, server_pid: int) -> None:
        """Time ``count`` calls of ``call(i)``, one by one."""
        client, server = time.process_time(), cpu_s(server_pid)
        for i in range(count):
            started = time.perf_counter()
            call(i)
            self.seconds.append(time.perf_counter() - started)
        self.client_cpu_s += time.process_time() - client
        self.server_cpu_s += cpu_s(server_pid) - server


def storer(mode: str, mem: MemoryClient, api: httpx.Client, secret: str) -> Callable[[int], object]:
    """store(i): one note directly (``mode`` "direct") or through the HTTP API ("http")."""
    auth = {"Authorization": f"Bearer {secret}"}

    def direct(i: int) -> object:
        return mem.store(f"{TEXT} {i}", namespace=NS)

    def through_http(i: int) -> object:
        body = {"content": f"{TEXT} {i}"}
        response = api.post(f"/v1/namespaces/{NS}/notes", json=body, headers=auth)
        assert response.status_code == 202, response.text
        return response

    return direct if mode == "direct" else through_http


def stdlib_storer(conn: http.client.HTTPConnection, secret: str) -> Callable[[int], object]:
    """store(i) through the HTTP API with the standard library's client (lighter than httpx)."""
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}

    def post(i: int) -> object:
        body = json.dumps({"content": f"{TEXT} {i}"}).encode()
        conn.request("POST", f"/v1/namespaces/{NS}/notes", body=body, headers=headers)
        response = conn.getresponse()
        assert response.status == 202, response.read()
        return response.read()

    def store(i: int) -> object:
        try:
            return post(i)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            conn.close()  # uvicorn closed it while idle (keep-alive timeout): once per round
            return post(i)

    return store


def serve(settings: ProducerSettings, port: int) -> subprocess.Popen[bytes]:
    """``zettelq serve`` on the settings' Redis and prefix, once it answers /health."""
    env = {**os.environ, "ZQ_REDIS_URL": settings.redis_url, "ZQ_KEY_PREFIX": settings.key_prefix}
    argv = [sys.executable, "-m", "worker.cli.main", "serve", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
            return proc
        except httpx.TransportError:
            assert proc.poll() is None and time.monotonic() < deadline, "zettelq serve failed"
            time.sleep(0.1)


def latency(
    settings: ProducerSettings, port: int, server_pid: int, secret: str, rounds: int, calls: int
) -> str:
    """The latency table (markdown): the paths interleaved round by round."""
    url = f"http://127.0.0.1:{port}"
    with MemoryClient(settings) as mem, httpx.Client(base_url=url) as api:
        conn = http.client.HTTPConnection("127.0.0.1", port)

        def health(i: int) -> object:
            return api.get("/health")

        paths = {
            "direct store()": storer("direct", mem, api, secret),
            "HTTP POST notes (httpx)": storer("http", mem, api, secret),
            "HTTP POST notes (http.client)": stdlib_storer(conn, secret),
            "HTTP GET /health (httpx)": health,
        }
        samples = {name: Samples() for name in paths}
        for call in paths.values():
            Samples().run(call, 200, server_pid)  # warm-up
        for _ in range(rounds):
            for name, call in paths.items():
                samples[name].run(call, calls, server_pid)
        conn.close()
    base = percentile(samples["direct store()"].seconds, 0.5)
    lines = [
        "| path | calls | p50 ms | p99 ms | p50 minus direct p50 | client CPU ms/call "
        "| server CPU ms/call |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, got in samples.items():
        n = len(got.seconds)
        p50, p99 = percentile(got.seconds, 0.5), percentile(got.seconds, 0.99)
        cells = [f"{p50 * 1e3:.3f}", f"{p99 * 1e3:.3f}", f"{(p50 - base) * 1e3:+.3f}"]
        cells += [f"{got.client_cpu_s / n * 1e3:.3f}", f"{got.server_cpu_s / n * 1e3:.3f}"]
        lines.append(f"| {name} | {n} | {' | '.join(cells)} |")
    return "\n".join(lines)


def client_loop(mode: str, settings: ProducerSettings, url: str, secret: str, span_s: float) -> int:
    """One client process: stores back to back for ``span_s`` seconds; returns how many."""
    deadline = time.monotonic() + span_s
    count = 0
    with MemoryClient(settings) as mem, httpx.Client(base_url=url) as api:
        store = storer(mode, mem, api, secret)
        while time.monotonic() < deadline:
            store(count)
            count += 1
    return count


def throughput(settings: ProducerSettings, url: str, secret: str, args: argparse.Namespace) -> str:
    """The throughput table (markdown)."""
    lines = ["| path | clients | seconds | stores | stores/s |", "|---|---|---|---|---|"]
    for mode in ("direct", "http"):
        jobs = [(mode, settings, url, secret, args.seconds)] * args.clients
        started = time.monotonic()
        with mp.Pool(args.clients) as pool:
            stores = sum(pool.starmap(client_loop, jobs))
        wall = time.monotonic() - started
        rate = f"{stores / wall:,.0f}"
        lines.append(f"| {mode} | {args.clients} | {wall:.1f} | {stores} | {rate} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1000, help="timed calls per path per round")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--redis", help="a Redis URL to use (default: a redis-server of its own)")
    args = p.parse_args()
    with ExitStack() as stack:
        url = args.redis or stack.enter_context(EmbeddedRedis()).url
        tables = run(url, args)
    sys.stdout.write("\n\n".join(tables) + "\n")
    return 0


def run(redis_url: str, args: argparse.Namespace) -> list[str]:
    """Both tables, under a key prefix of the run's own (deleted afterwards)."""
    prefix = f"http{os.getpid()}"
    settings = ProducerSettings(redis_url=redis_url, key_prefix=prefix, max_pending=0)
    with TokenStore.from_settings(settings) as tokens:
        secret, _ = tokens.create(write=[NS], label="bench")
    port = free_port()
    proc = serve(settings, port)
    try:
        url = f"http://127.0.0.1:{port}"
        return [
            latency(settings, port, proc.pid, secret, args.rounds, args.calls),
            throughput(settings, url, secret, args),
        ]
    finally:
        proc.terminate()
        proc.wait(10)
        with Redis.from_url(redis_url) as r:
            for key in r.scan_iter(f"{prefix}:*", count=1000):
                r.delete(key)


if __name__ == "__main__":
    sys.exit(main())
