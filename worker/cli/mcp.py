"""``zettelq mcp [--http --host H --port N --path /mcp --stateless]``: serve zettelq's tools to
MCP clients (Claude Desktop, Claude Code, Cursor, ...); needs ``pip install 'zettelq[mcp]'``.

Over stdio (the default) the client starts this process and speaks MCP on its stdin and
stdout, so nothing else is written to stdout (logs and warnings go to stderr); every tool acts
on ZQ_MCP_NAMESPACE (default ZQ_DEFAULT_NAMESPACE). With ``--http`` it serves streamable HTTP
on HOST:PORT (``/mcp`` and ``GET /health``), each caller bound by its bearer token; until
SIGTERM or Ctrl-C. See docs/mcp.md.
"""

from __future__ import annotations

import argparse

from worker.cli.console import Handler
from worker.settings import WorkerSettings

DEFAULT_PORT = 8765  #: port of ``zettelq mcp --http``


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    """Add ``mcp`` to the ``zettelq`` subcommands; return its handler."""
    p = sub.add_parser("mcp", help="serve the memory tools to MCP clients (stdio, or --http)")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default: %(default)s)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="HTTP port (default: %(default)s)"
    )
    p.add_argument("--path", default="/mcp", help="HTTP endpoint path (default: %(default)s)")
    p.add_argument(
        "--stateless",
        action="store_true",
        help="keep no session between HTTP requests (replicas behind a load balancer)",
    )
    return {"mcp": run}


def run(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    import anyio

    if args.http:
        from producer.adapters.mcp_http import run as run_http

        run_http(settings, host=args.host, port=args.port, path=args.path, stateless=args.stateless)
    else:
        anyio.run(serve_stdio, settings)
    return 0


async def serve_stdio(settings: WorkerSettings) -> None:
    from producer.adapters.mcp import build_server
    from producer.async_client import AsyncMemoryClient

    namespace = settings.mcp_namespace or settings.default_namespace
    async with AsyncMemoryClient(settings) as client:
        await build_server(client, namespace).run_stdio_async()
