"""``zettelq serve`` (the HTTP API on uvicorn) and ``zettelq token create|list|revoke`` (its bearer
tokens). Both need ``pip install 'zettelq[server]'`` only for serving; tokens are plain Redis.

zettelq serve [--host 127.0.0.1] [--port 8080] [--access-log] [--review]
                                                        the API, and the live graph at /graph/NS
zettelq token create --read NS --write NS [--label L]   prints the secret once, and its id
zettelq token list                                      every token: id, label, grants, created
zettelq token revoke ID
"""

from __future__ import annotations

import argparse

from producer.adapters.tokens import TokenStore
from producer.errors import NotFound
from worker.cli.console import Handler, Printer, add_output_options
from worker.readable import readable
from worker.settings import WorkerSettings

DEFAULT_HOST = "127.0.0.1"  #: zettelq serve listens here unless told otherwise
DEFAULT_PORT = 8080  #: and on this port
TOKEN_COLUMNS = ("token_id", "label", "read", "write", "created_at")  #: token list's table


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    """Add ``serve`` and ``token`` to the ``zettelq`` subcommands; return their handlers."""
    serve = sub.add_parser("serve", help="serve the HTTP API (needs zettelq[server])")
    serve.add_argument("--host", default=DEFAULT_HOST, help="address (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="(default: %(default)s)")
    serve.add_argument(
        "--access-log", action="store_true", help="log every request (uvicorn's access log)"
    )
    serve.add_argument(
        "--review",
        action="store_true",
        help="the live graph at /graph/NS also lists pending evolution proposals to accept or"
        " reject (for tokens that may write NS)",
    )
    token = sub.add_parser("token", help="create, list or revoke HTTP API bearer tokens")
    actions = token.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a new token; prints its secret once")
    create.add_argument(
        "--read",
        action="append",
        default=[],
        metavar="NS",
        help="may read NS (* = any)",
    )
    create.add_argument(
        "--write", action="append", default=[], metavar="NS", help="may write NS (* = any)"
    )
    create.add_argument("--label", default="", help="who or what the token is for")
    listing = actions.add_parser("list", help="every token (never their secrets)")
    revoke = actions.add_parser("revoke", help="revoke a token at once")
    revoke.add_argument("token_id", metavar="ID")
    for parser in (create, listing, revoke):
        add_output_options(parser)
    return {"serve": _serve, "token": _token}


def _serve(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    import uvicorn

    from producer.adapters.http import create_app
    from worker.explorer.live import live_app

    app = create_app(settings, extra_mounts={"/graph": live_app(settings, review=args.review)})
    uvicorn.run(app, host=args.host, port=args.port, access_log=args.access_log)
    return 0


def _token(settings: WorkerSettings, args: argparse.Namespace, rest: list[str]) -> int:
    tokens = TokenStore.from_settings(settings)
    try:
        _TOKEN_ACTIONS[args.action](tokens, args)
    finally:
        tokens.close()
    return 0


def _create(tokens: TokenStore, args: argparse.Namespace) -> None:
    secret, grant = tokens.create(read=args.read, write=args.write, label=args.label)
    text = (
        f"created token {grant.token_id}; its secret is shown only now:\n{secret}\n"
        f"use it as:  Authorization: Bearer {secret}"
    )
    Printer.of(args).message(text, secret=secret, **readable(_row(grant.model_dump())))


def _list(tokens: TokenStore, args: argparse.Namespace) -> None:
    rows = [_row(g.model_dump()) for g in tokens.list()]
    Printer.of(args).rows(rows, TOKEN_COLUMNS, "no tokens")


def _revoke(tokens: TokenStore, args: argparse.Namespace) -> None:
    if not tokens.revoke(args.token_id):
        raise NotFound(f"no token {args.token_id!r}")
    Printer.of(args).message(f"revoked token {args.token_id}", token_id=args.token_id)


def _row(grant: dict[str, object]) -> dict[str, object]:
    """A grant with its namespace sets as sorted lists (for tables and JSON)."""
    return {k: sorted(v) if isinstance(v, frozenset) else v for k, v in grant.items()}


_TOKEN_ACTIONS = {"create": _create, "list": _list, "revoke": _revoke}
