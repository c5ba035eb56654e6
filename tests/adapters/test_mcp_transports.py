"""``zettelq mcp`` over its two transports, as MCP clients meet it: stdio (a real subprocess
driven by the SDK's stdio client) and streamable HTTP (the ASGI app on a real uvicorn on
127.0.0.1, the SDK's HTTP client with a bearer token); against the real Redis, with the worker's
code in threads of the test."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("mcp", reason="the MCP server needs the mcp extra: pip install 'zettelq[mcp]'")

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from producer.adapters.mcp import Found, Stored
from producer.adapters.mcp_http import choose_namespace, http_app
from producer.adapters.tokens import Forbidden, Grant, TokenStore
from producer.errors import InvalidInput
from tests.adapters.conftest import eventually, token_reads, uvicorn_serving
from tests.adapters.test_mcp import call, error_of, text
from tests.conftest import drain_all
from worker.cli.mcp import DEFAULT_PORT
from worker.context import WorkerContext
from worker.runtime.devserver import free_port
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "mcp"


def stdio_env(**extra: str) -> dict[str, str]:
    """The environment of a ``zettelq mcp`` child: this one's (cli_env's ZQ_ settings) and more."""
    return {k: v for k, v in os.environ.items() if k != "ZQ_DEBUG"} | extra


def example(name: str) -> dict[str, Any]:
    """The one server entry of the client config examples/mcp/NAME."""
    config = json.loads((EXAMPLES / name).read_text())
    [entry] = config["mcpServers"].values()
    return dict(entry)


def test_the_claude_desktop_example_starts_a_server_that_stores_and_searches(
    cli_env: WorkerSettings, ctx: WorkerContext, server
):
    entry = example("claude_desktop_config.json")
    venv_bin = str(Path(sys.executable).parent)  # where pip put the zettelq command
    command = shutil.which(entry["command"], path=os.pathsep.join([venv_bin, os.environ["PATH"]]))
    assert command is not None, f"{entry['command']!r} is not a command"
    settings_of_the_test = {k: v for k, v in os.environ.items() if k.startswith("ZQ_")}
    params = StdioServerParameters(
        command=command,
        args=entry["args"],
        env=stdio_env(**(entry["env"] | settings_of_the_test)),  # the test's Redis, not 6379
        cwd=str(ROOT),
    )
    namespace = entry["env"]["ZQ_MCP_NAMESPACE"]

    async def main() -> None:
        async with Client(params) as client:
            stored = await call(client, "memory_store", content="stdio agents share one memory")
            note_id = Stored.model_validate(stored.structured_content).id
            await asyncio.to_thread(drain_all, ctx)
            found = await call(client, "memory_search", query="agents share memory")
            hits = Found.model_validate(found.structured_content).hits
            assert [(h.id, h.namespace) for h in hits] == [(note_id, namespace)]

    asyncio.run(main())


def test_stdio_writes_nothing_but_protocol_messages_to_stdout(cli_env: WorkerSettings):
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=stdio_env(ZQ_MCP_NAMESPAC="typo"),  # its warning must go to stderr
        text=True,
        cwd=ROOT,
    )
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in (hello, ready, listed)))
        proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline()) for _ in range(2)]
        out, err = proc.communicate()  # closes stdin: the server ends
    finally:
        watchdog.cancel()

    assert proc.returncode == 0, err
    assert [r["id"] for r in replies] == [1, 2] and out == ""
    assert all(r["jsonrpc"] == "2.0" and "result" in r for r in replies)
    assert len(replies[1]["result"]["tools"]) == 9
    assert "ZQ_MCP_NAMESPAC is not a zettelq setting" in err


def serving(settings: WorkerSettings) -> AbstractContextManager[str]:
    """The MCP HTTP app on uvicorn, 127.0.0.1 and a free port, in a thread; yields its URL."""
    return uvicorn_serving(http_app(settings))


async def tool_call(url: str, secret: str, tool: str, namespace: str | None = None, **args):
    headers = {"Authorization": f"Bearer {secret}"}
    if namespace is not None:
        headers["X-Zettelq-Namespace"] = namespace
    async with httpx2.AsyncClient(headers=headers) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
            return await client.call_tool(tool, args)


def test_streamable_http_binds_each_call_to_its_tokens_namespace(
    settings: WorkerSettings, ctx: WorkerContext, server, tokens: TokenStore
):
    alice, _ = tokens.create(write=["alice"], read=["alice"], label="alice")
    bob, _ = tokens.create(write=["bob"], read=["bob", "shared"], label="bob")

    async def main(url: str) -> None:
        stored = await tool_call(url, alice, "memory_store", content="alice's locker code is 4711")
        assert Stored.model_validate(stored.structured_content).namespace == "alice"
        await asyncio.to_thread(drain_all, ctx)

        mine = await tool_call(url, alice, "memory_search", query="locker code")
        assert "4711" in text(mine)
        theirs = await tool_call(url, bob, "memory_search", query="locker code")
        assert Found.model_validate(theirs.structured_content).namespace == "bob"
        assert "4711" not in text(theirs)
        denied = await tool_call(url, bob, "memory_store", namespace="shared", content="x")
        assert error_of(denied) == "Forbidden"
        read_only = await tool_call(url, bob, "memory_stats", namespace="shared")
        assert not read_only.is_error

        async with httpx2.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).json() == {"status": "ok"}
            asked = {"X-Zettelq-Namespace": "alice", "Authorization": f"Bearer {bob}"}
            assert (await http.post("/mcp", json={}, headers=asked)).status_code == 403

    with serving(settings) as url:
        asyncio.run(main(url))


def test_over_http_store_many_reports_progress_and_a_quiet_call_gets_json(
    settings: WorkerSettings, tokens: TokenStore
):
    secret, _ = tokens.create(read=["progress"], write=["progress"])
    items = [{"content": f"fact {i} about tides"} for i in range(150)]
    progress: list[tuple[float, float | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total))

    async def main(url: str) -> None:
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx2.AsyncClient(headers=headers) as http:
            async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
                many = await client.call_tool(
                    "memory_store_many", {"items": items}, progress_callback=on_progress
                )
                assert not many.is_error and len(many.structured_content["ids"]) == 150
            reply = await http.post(
                f"{url}/mcp",
                json=modern_call(1, "memory_store"),
                headers={**MODERN_HEADERS, "Mcp-Name": "memory_store"},
            )
            assert reply.headers["content-type"] == "application/json"
            assert reply.json()["result"]["structuredContent"]["namespace"] == "progress"
            body = modern_call(2, "memory_store_many", progressToken="p")
            body["params"]["arguments"] = {"items": items}
            headers = {**MODERN_HEADERS, "Mcp-Name": "memory_store_many"}
            async with http.stream("POST", f"{url}/mcp", json=body, headers=headers) as streamed:
                assert streamed.headers["content-type"] == "text/event-stream"
                events = (await streamed.aread()).decode()
            assert events.count("notifications/progress") == 2 and '"ids"' in events

    with serving(settings) as url:
        asyncio.run(main(url))
    assert progress == [(100, 150), (150, 150)]


#: the routing headers of a 2026-07-28 tools/call (Mcp-Name is the tool's)
MODERN_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
}


def modern_call(request_id: int, tool: str, **meta: str) -> dict[str, Any]:
    """A 2026-07-28 tools/call body (the per-request envelope in _meta), content "x"."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": tool, "arguments": {"content": "x"}, "_meta": envelope | meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


@pytest.mark.parametrize("stateless", [False, True])
def test_a_handshake_era_client_is_served_with_and_without_sessions(
    settings: WorkerSettings, tokens: TokenStore, stateless: bool
):
    secret, _ = tokens.create(read=["legacy"], write=["legacy"])

    async def main(url: str) -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {secret}"}) as http:
            transport = streamable_http_client(f"{url}/mcp", http_client=http)
            async with Client(transport, mode="legacy") as client:
                stored = await call(client, "memory_store", content="the old protocol still works")
                assert Stored.model_validate(stored.structured_content).namespace == "legacy"
                stats = await call(client, "memory_stats")
                assert stats.structured_content["namespace"] == "legacy"

    with uvicorn_serving(http_app(settings, stateless=stateless)) as url:
        asyncio.run(main(url))


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer zq_0123456789abcdef_" + "x" * 43, "Basic dXNlcjpwYXNz", "Bearer"],
)
def test_streamable_http_without_a_valid_token_is_401_and_no_data(
    settings: WorkerSettings, tokens: TokenStore, authorization: str | None
):
    headers = {"Authorization": authorization} if authorization else {}
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}

    with serving(settings) as url:
        reply = httpx2.post(f"{url}/mcp", json=listing, headers=headers)

    assert reply.status_code == 401
    assert reply.headers["www-authenticate"].startswith("Bearer")
    assert reply.json()["error"]["type"] == "Unauthenticated"
    assert "tools" not in reply.text


def test_streamable_http_refuses_a_revoked_cached_token_once_the_publish_arrives(
    settings: WorkerSettings, tokens: TokenStore, redis_db
):
    secret, grant = tokens.create(write=["a"])
    door = settings.model_copy(update={"token_cache_s": 600.0})  # only the revoke ends it
    headers = {"Authorization": f"Bearer {secret}"}

    with uvicorn_serving(http_app(door)) as url, httpx2.Client(base_url=url) as http:

        def post() -> int:
            return http.post("/mcp", json={}, headers=headers).status_code

        eventually(lambda: token_reads(redis_db, post) == 0, "the token's grant is cached")
        assert tokens.revoke(grant.token_id)
        eventually(lambda: post() == 401, "the revoked token is refused")
        assert post() == 401


def test_the_cursor_http_example_reaches_the_server_with_its_token(
    settings: WorkerSettings, tokens: TokenStore
):
    entry = example("cursor_http.json")
    secret, _ = tokens.create(read=["cursor"], write=["cursor"])
    configured = urlsplit(entry["url"])
    assert (configured.hostname, configured.port) == ("127.0.0.1", DEFAULT_PORT)
    headers = {k: v.replace("${env:ZETTELQ_TOKEN}", secret) for k, v in entry["headers"].items()}

    async def main(url: str) -> None:
        async with httpx2.AsyncClient(headers=headers) as http:
            endpoint = f"{url}{configured.path}"
            async with Client(streamable_http_client(endpoint, http_client=http)) as client:
                stats = await call(client, "memory_stats")
                assert stats.structured_content["namespace"] == "cursor"

    with serving(settings) as url:
        asyncio.run(main(url))


def test_the_readme_shows_the_example_config():
    section = (ROOT / "README.md").read_text().split("\n## MCP\n")[1].split("\n## ")[0]
    shown = section.split("```json\n")[1].split("```")[0]

    assert json.loads(shown) == json.loads((EXAMPLES / "claude_desktop_config.json").read_text())


def test_zettelq_mcp_http_serves_until_sigterm(cli_env: WorkerSettings, tokens: TokenStore):
    secret, _ = tokens.create(read=["cli-http"], write=["cli-http"])
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.cli.main",
            "mcp",
            "--http",
            "--port",
            str(port),
            "--stateless",
        ],
        env=stdio_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not health_of(url):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        stats = asyncio.run(tool_call(url, secret, "memory_stats"))
        assert stats.structured_content["namespace"] == "cli-http"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=15)

    # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (as uvicorn does)
    assert proc.returncode == -signal.SIGTERM, err
    assert "Traceback" not in err and out == ""


def health_of(url: str) -> bool:
    try:
        return httpx2.get(f"{url}/health").json() == {"status": "ok"}
    except httpx2.TransportError:
        return False


def test_the_http_app_mounts_in_the_http_api(settings: WorkerSettings, tokens: TokenStore):
    api = pytest.importorskip("producer.adapters.http", reason="the HTTP API needs zettelq[server]")
    secret, _ = tokens.create(read=["mounted"], write=["mounted"])
    app = api.create_app(settings, extra_mounts={"/agents": http_app(settings)})

    async def main(url: str) -> None:
        stats = await tool_call(f"{url}/agents", secret, "memory_stats")
        assert stats.structured_content["namespace"] == "mounted"
        async with httpx2.AsyncClient(base_url=url) as http:
            assert (await http.get("/agents/health")).json() == {"status": "ok"}
            assert (await http.post("/agents/mcp", json={})).status_code == 401
            assert (await http.get("/health")).status_code == 200  # the API's own

    with uvicorn_serving(app) as url:
        asyncio.run(main(url))


def grant(read: set[str], write: set[str]) -> Grant:
    return Grant(
        token_id="0123456789abcdef",
        label="",
        read=frozenset(read),
        write=frozenset(write),
        created_at=0.0,
    )


@pytest.mark.parametrize(
    ("read", "write", "asked", "chosen"),
    [
        ({"a"}, {"a"}, None, "a"),
        ({"a", "b"}, {"a"}, None, "a"),  # the one write namespace
        ({"b"}, set(), None, "b"),  # read-only: the one read namespace
        ({"a", "b"}, {"a"}, "b", "b"),
        ({"*"}, set(), "anything", "anything"),
    ],
)
def test_the_namespace_is_the_asked_one_if_granted_else_the_only_one(read, write, asked, chosen):
    assert choose_namespace(grant(read, write), asked) == chosen


@pytest.mark.parametrize(
    ("read", "write", "asked", "error"),
    [
        ({"a"}, {"a"}, "b", Forbidden),  # not granted
        ({"a"}, {"a"}, "bad ns!", InvalidInput),
        ({"a", "b"}, {"a", "b"}, None, InvalidInput),  # several: name one
        ({"*"}, {"*"}, None, InvalidInput),
        ({"a", "b"}, set(), None, InvalidInput),
    ],
)
def test_an_ungranted_or_ambiguous_namespace_is_refused(read, write, asked, error):
    with pytest.raises(error):
        choose_namespace(grant(read, write), asked)
