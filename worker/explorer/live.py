"""The graph explorer served live by ``zettelq serve`` at ``/graph/NAMESPACE``: the page that
``zettelq graph`` writes, read fresh from Redis on every request, behind the HTTP API's bearer
tokens (a token that may read the namespace). Read-only by default; ``zettelq serve --review``
adds the namespace's pending evolution proposals below the graph, with accept and reject
buttons for tokens that may write it.

A browser cannot send a bearer header when it opens a page, so the token may also come as the
``token`` query parameter (and the review forms post it back as a form field). The page is
served with ``Cache-Control: no-store`` and ``Referrer-Policy: no-referrer`` so that the URL
holding it is neither cached nor passed on; ``zettelq serve`` keeps no access log unless asked.
"""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from producer import MemoryClient
from producer import validation as v
from producer.adapters.http import errors
from producer.adapters.tokens import Forbidden, Grant, TokenStore, Unauthenticated
from producer.connection import data_redis
from producer.errors import InvalidInput, ZettelqError
from producer.protocol import Proposal
from worker.connection import Streams
from worker.explorer.page import render_page
from worker.explorer.view import MAX_HOPS, read_view, select
from worker.settings import WorkerSettings

DEFAULT_MAX_NODES = 500  #: notes a live page shows unless ?max_nodes= says otherwise
MAX_NODES = 5_000  #: the most a live page shows (a larger view is for `zettelq graph`)
SHOWN_PROPOSALS = 50  #: pending proposals listed below the graph
HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def live_app(settings: WorkerSettings, *, review: bool = False) -> Starlette:
    """The explorer: ``GET /{ns}`` and, with ``review``, ``POST /{ns}/proposals/{id}/{action}``."""
    mem = MemoryClient(settings)
    tokens = TokenStore.from_settings(settings)
    st = Streams(data_redis(settings), mem.keys)

    def page(request: Request) -> Response:
        ns, secret = _namespace(request), _token(request, request.query_params.get("token"))
        grant = _granted(tokens, secret, ns, write=False)
        params = request.query_params
        wanted = _int(params.get("max_nodes"), DEFAULT_MAX_NODES)
        max_nodes = v.check_int(wanted, "max_nodes", 1, MAX_NODES)
        seed, query = params.get("seed") or None, params.get("query") or None
        default_hops = 2 if seed else 0
        hops = v.check_int(_int(params.get("hops"), default_hops), "hops", 0, MAX_HOPS)
        selection = select(mem, st, ns, seed=seed, query=query, hops=hops, max_nodes=max_nodes)
        view = read_view(st, ns, selection)
        panel = None
        if review:
            pending = mem.proposals(ns, status="pending", limit=SHOWN_PROPOSALS)
            panel = review_panel(pending, request.url.path, secret, grant.can_write(ns))
        return HTMLResponse(render_page(view, extra=panel), headers=HEADERS)

    async def decide(request: Request) -> Response:
        form = await request.form()
        ns = _namespace(request)
        field = form.get("token")
        secret = _token(request, field if isinstance(field, str) else None)
        _granted(tokens, secret, ns, write=True)
        action, proposal_id = request.path_params["action"], request.path_params["pid"]
        if action not in ("accept", "reject"):
            return PlainTextResponse("unknown action", status_code=404)
        step = mem.accept if action == "accept" else mem.reject
        step(proposal_id, namespace=ns, agent="graph-explorer")
        back = request.url.path.rsplit("/proposals/", 1)[0] + "?" + urlencode({"token": secret})
        return RedirectResponse(back, status_code=303, headers=HEADERS)

    routes = [Route("/{ns:path}", page, methods=["GET"])]
    if review:
        routes.insert(0, Route("/{ns:path}/proposals/{pid}/{action}", decide, methods=["POST"]))
    handlers: dict[Any, Any] = {ZettelqError: errors.on_zettelq_error}
    return Starlette(routes=routes, exception_handlers=handlers)


def review_panel(pending: list[Proposal], path: str, secret: str, may_write: bool) -> str:
    """The pending proposals as HTML (every stored value escaped), with accept/reject forms when
    the token may write the namespace."""
    rows = []
    for p in pending:
        changes = "".join(
            f"<li><code>{_e(name)}</code>: {_e(p.before.get(name))} → {_e(p.after.get(name))}</li>"
            for name in p.fields
        )
        forms = ""
        if may_write:
            forms = "".join(
                f'<form method="post" action="{_e(path)}/proposals/{quote(p.id)}/{action}">'
                f'<input type="hidden" name="token" value="{_e(secret)}">'
                f'<button type="submit">{action}</button></form>'
                for action in ("accept", "reject")
            )
        rows.append(
            f'<li class="zq-proposal"><strong>{_e(p.id)}</strong> on note {_e(p.note)} '
            f"({_e(p.source)}): {_e(p.reason)}<ul>{changes}</ul>{forms}</li>"
        )
    body = "".join(rows) or "<li>no pending proposals</li>"
    return f'<section id="zq-review"><h2>evolution proposals</h2><ul>{body}</ul></section>'


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _namespace(request: Request) -> str:
    return v.check_namespace(request.path_params["ns"])


def _token(request: Request, given: str | None) -> str:
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and secret:
        return secret
    if given:
        return given
    raise Unauthenticated("a token is needed: Authorization: Bearer ..., or ?token=")


def _granted(tokens: TokenStore, secret: str, ns: str, *, write: bool) -> Grant:
    grant = tokens.check(secret)
    if grant is None:
        raise Unauthenticated("unknown or revoked token", invalid_token=True)
    if not (grant.can_write(ns) if write else grant.can_read(ns)):
        raise Forbidden(f"this token may not {'write' if write else 'read'} {ns!r}")
    return grant


def _int(raw: str | None, default: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise InvalidInput(f"not a whole number: {raw[:40]!r}") from exc
