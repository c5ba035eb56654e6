"""What the MCP door adds to a store: store() latency direct vs through the MCP server, against
the MCP SDK's own floor (a bare SDK server whose tool does nothing) in the same run.

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/mcp_door.py`` (about three
minutes with the default floors). Uses the Redis at ``--redis`` (default
``redis://127.0.0.1:6379/7``) under a key prefix of its own and deletes its keys at the end. No
worker runs: a store never waits for one, so this is the producer's cost alone, as the agent
sees it.

In each round, ``--calls`` stores (after ``--warmup`` untimed ones) of a ~200 B note through
each door, one at a time, each timed from the call to its return:

1. ``direct``: ``AsyncMemoryClient.store()`` (the baseline);
2. ``mcp memory``: ``memory_store`` through the SDK's in-memory ``Client(server)`` (the same
   process: the cost of the MCP layers, JSON-RPC and validation, without a transport);
3. ``floor <mode>``: a tool call to a bare SDK server (``MCPServer`` with one tool that returns
   an id and does nothing else; no token, no Redis), served as ``zettelq mcp --http`` serves
   (uvicorn on 127.0.0.1, uvloop, httptools, no access log) in a subprocess, in each mode of
   ``--floors``: ``json`` / ``sse`` (the SDK's ``json_response`` on / off), ``-stateless`` for
   ``stateless_http``;
4. ``zettelq``: ``memory_store`` through a ``zettelq mcp --http`` subprocess (``--stateless``
   with the flag) with a bearer token.

Doors 3 and 4 are each called by two clients: ``sdk``, the SDK's streamable-HTTP ``Client``
(one client for the whole run, so one discovery; each call is one POST of the 2026-07-28
protocol, validated on return against the tool's output schema), and ``light``, a minimal
client of the same protocol (the same POST with the SDK's headers and envelope on one keep-alive
connection, the reply's JSON checked for a result that is no error), which shows the server's
share without the SDK client's. Rounds interleave the doors, in an order rotated each round, so
a change of load moves all of them alike. The table gives each door's p50 and p99 over every
round, its p50 as a ratio to the direct p50 of the same run and the difference in ms, and the
CPU each call cost the bench process (the client; the in-memory door's server too) and the
server process (from /proc). The lines below it give zettelq's p50 above the floor of the mode
it answers ``memory_store`` in (JSON) with the same client, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from redis import Redis

from producer import AsyncMemoryClient, ProducerSettings
from producer.adapters.mcp import WRITE, Stored, build_server
from producer.adapters.tokens import TokenStore
from producer.protocol import new_id
from worker.runtime.devserver import free_port

ROOT = Path(__file__).resolve().parents[1]  #: repo root, the servers' working directory
NAMESPACE = "bench-mcp"  #: the one namespace every note goes to
NOTE = "The deploy key of the staging cluster rotates every ninety days; " * 3  #: ~200 B
START_TIMEOUT_S = 30.0  #: how long a server may take to answer /health
FLOOR_MODES = ("json", "sse", "json-stateless", "sse-stateless")  #: what --floors may name
PROTOCOL = MODERN_PROTOCOL_VERSIONS[-1]  #: what the SDK client speaks with the servers

Store = Callable[[int], Awaitable[object]]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (from /proc); 0 without one."""
    if pid is None:
        return 0.0
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Door:
    """One way to store, its latencies and the CPU both sides spent on them."""

    store: Store
    server_pid: int | None = None
    seconds: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    async def series(self, calls: int, warmup: int) -> None:
        """``calls`` timed stores after ``warmup`` untimed ones."""
        for i in range(warmup):
            await self.store(i)
        client, server = time.process_time(), cpu_s(self.server_pid)
        for i in range(calls):
            start = time.perf_counter()
            await self.store(i)
            self.seconds.append(time.perf_counter() - start)
        self.client_cpu_s += time.process_time() - client
        self.server_cpu_s += cpu_s(self.server_pid) - server


class LightClient:
    """A minimal MCP client of the 2026-07-28 protocol: each tool call one POST on one
    keep-alive connection, with the SDK client's headers and envelope."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        rest = url.removeprefix("http://")
        authority, _, path = rest.partition("/")
        host, _, port = authority.partition(":")
        self.host, self.port, self.path = host, int(port), f"/{path}"
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.meta = {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientInfo": {"name": "bench-light", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        self.ids = 0
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The tool's result; reconnects once if the server closed the idle connection."""
        try:
            return await self._call(name, arguments)
        except (ConnectionError, asyncio.IncompleteReadError):
            await self.aclose()
            return await self._call(name, arguments)

    async def _call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        self.ids += 1
        params = {"name": name, "arguments": arguments, "_meta": self.meta}
        request = {"jsonrpc": "2.0", "id": self.ids, "method": "tools/call", "params": params}
        body = json.dumps(request)
        head = (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n{self.headers}"
            "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
            f"mcp-protocol-version: {PROTOCOL}\r\nmcp-method: tools/call\r\nmcp-name: {name}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body.encode())
        status, _, rest = (await reader.readuntil(b"\r\n\r\n")).partition(b"\r\n")
        fields = dict(line.split(b": ", 1) for line in rest.lower().split(b"\r\n") if line)
        reply = json.loads(await reader.readexactly(int(fields[b"content-length"])))
        if not status.startswith(b"HTTP/1.1 200") or reply.get("result", {}).get("isError", True):
            raise RuntimeError(f"the tool call failed: {status!r} {reply}")
        return dict(reply["result"])

    async def aclose(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


def floor_server(mode: str, port: int) -> None:
    """The bare SDK server of ``mode``, served until terminated (the subprocess's main)."""
    import anyio
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    server: MCPServer = MCPServer("floor", log_level="WARNING")

    async def memory_store(content: str) -> Stored:
        """Return an id, store nothing."""
        return Stored(id=new_id(), namespace=NAMESPACE)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    server.add_tool(memory_store, annotations=WRITE)
    server.custom_route("/health", methods=["GET"])(health)
    app = server.streamable_http_app(
        json_response=mode.startswith("json"), stateless_http=mode.endswith("-stateless")
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    uvloop = importlib.util.find_spec("uvloop") is not None
    anyio.run(uvicorn.Server(config).serve, backend_options={"use_uvloop": uvloop})


@contextmanager
def serving(argv: list[str], port: int, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A server subprocess; yields its base URL and pid once it answers /health."""
    proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=ROOT)
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
                raise RuntimeError(f"{argv} did not start")
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        proc.terminate()
        proc.wait(15)


async def measure(
    settings: ProducerSettings,
    servers: dict[str, tuple[str, int]],
    secret: str,
    args: argparse.Namespace,
) -> dict[str, Door]:
    """Per door, the latencies and CPU of every round."""
    auth = {"Authorization": f"Bearer {secret}"}
    async with AsyncExitStack() as stack:
        memory = await stack.enter_async_context(AsyncMemoryClient(settings))
        in_memory = await stack.enter_async_context(Client(build_server(memory, NAMESPACE)))

        def via(client: Client | LightClient) -> Store:
            return lambda i: client.call_tool("memory_store", {"content": NOTE})

        async def direct(i: int) -> object:
            return await memory.store(NOTE, namespace=NAMESPACE)

        doors = {"direct": Door(direct), "mcp memory": Door(via(in_memory))}
        for name, (base, pid) in servers.items():
            headers = auth if name == "zettelq" else {}
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers))
            sdk = Client(streamable_http_client(f"{base}/mcp", http_client=http))
            light = LightClient(f"{base}/mcp", headers)
            stack.push_async_callback(light.aclose)
            doors[f"{name}, sdk client"] = Door(via(await stack.enter_async_context(sdk)), pid)
            doors[f"{name}, light client"] = Door(via(light), pid)
        order = list(doors.values())
        for r in range(args.rounds):
            for door in order[r % len(order) :] + order[: r % len(order)]:
                await door.series(args.calls, args.warmup)
    return doors


def report(doors: dict[str, Door], floor: str) -> None:
    base = pct(doors["direct"].seconds, 0.5)
    print(
        "| door | stores | p50 ms | p99 ms | p50 / direct p50 | p50 added ms "
        "| bench CPU ms/call | server CPU ms/call |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, door in doors.items():
        n = len(door.seconds)
        p50, p99 = pct(door.seconds, 0.5), pct(door.seconds, 0.99)
        server = f"{door.server_cpu_s / n * 1000:.3f}" if door.server_pid else "-"
        print(
            f"| {name} | {n:,} | {p50 * 1000:.3f} | {p99 * 1000:.3f} | {p50 / base:.2f}x "
            f"| {(p50 - base) * 1000:+.3f} | {door.client_cpu_s / n * 1000:.3f} | {server} |"
        )
    for client in ("sdk", "light"):
        ours = doors[f"zettelq, {client} client"]
        theirs = doors.get(f"floor {floor}, {client} client")
        if theirs is not None:
            above = (pct(ours.seconds, 0.5) - pct(theirs.seconds, 0.5)) * 1000
            cpu = ours.server_cpu_s / len(ours.seconds) - theirs.server_cpu_s / len(theirs.seconds)
            print(
                f"\nzettelq above floor {floor}, {client} client: p50 {above:+.3f} ms, "
                f"server CPU {cpu * 1000:+.3f} ms/call"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/7")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1_000, help="timed stores per door and round")
    p.add_argument("--warmup", type=int, default=100, help="untimed stores before each series")
    p.add_argument(
        "--floors",
        default="json,sse",
        help=f"bare SDK servers to run, comma-separated, of {', '.join(FLOOR_MODES)} "
        "('none' for none; default: %(default)s)",
    )
    p.add_argument("--stateless", action="store_true", help="zettelq mcp --http --stateless")
    p.add_argument("--floor-server", choices=FLOOR_MODES, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.floor_server:
        floor_server(args.floor_server, args.port)
        return
    floors = [] if args.floors == "none" else args.floors.split(",")
    if unknown := set(floors) - set(FLOOR_MODES):
        p.error(f"unknown --floors {sorted(unknown)}")
    prefix = f"bmcp{uuid.uuid4().hex[:6]}"
    settings = ProducerSettings(redis_url=args.redis, key_prefix=prefix)
    tokens = TokenStore.from_settings(settings)
    secret, _ = tokens.create(read=[NAMESPACE], write=[NAMESPACE], label="bench")
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        with ExitStack() as stack:
            servers = {}
            for mode in floors:
                port = free_port()
                argv = [sys.executable, __file__, "--floor-server", mode, "--port", str(port)]
                servers[f"floor {mode}"] = stack.enter_context(serving(argv, port, {}))
            port = free_port()
            argv = [sys.executable, "-m", "worker.cli.main", "mcp", "--http", "--port", str(port)]
            env = {"ZQ_REDIS_URL": args.redis, "ZQ_KEY_PREFIX": prefix}
            extra = ["--stateless"] if args.stateless else []
            servers["zettelq"] = stack.enter_context(serving(argv + extra, port, env))
            doors = asyncio.run(measure(settings, servers, secret, args))
        report(doors, "json")
        packages = ", ".join(f"{n} {version(n)}" for n in ("mcp", "uvicorn", "uvloop", "httpx2"))
        print(
            f"\n{started} to {time.strftime('%H:%M:%S UTC', time.gmtime())}, 1-minute load "
            f"average {load:.2f} -> {os.getloadavg()[0]:.2f}; {packages}"
        )
    finally:
        tokens.close()
        redis = Redis.from_url(args.redis)
        keys = list(redis.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            redis.delete(*keys)
        redis.close()


if __name__ == "__main__":
    main()
