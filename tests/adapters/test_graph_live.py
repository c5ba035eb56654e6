"""The live graph explorer of ``zettelq serve`` (/graph/NS) on a real uvicorn: the page a token
may read, fresh on every request, stored text escaped; 401/403 without the grant; with
``--review`` the pending evolution proposals, accepted or rejected through the page's own forms
by a token that may write, and not offered to one that may only read."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="pip install -e '.[server]' to run this")
httpx = pytest.importorskip("httpx", reason="pip install -e '.[dev]' to run this")

from producer import MemoryClient  # noqa: E402
from producer.adapters.http import create_app  # noqa: E402
from producer.adapters.tokens import TokenStore  # noqa: E402
from tests.adapters.conftest import uvicorn_serving  # noqa: E402
from tests.conftest import drain_all, make_settings  # noqa: E402
from tests.integration.test_evolution import NS, SEED  # noqa: E402
from worker.context import WorkerContext  # noqa: E402
from worker.explorer.live import live_app  # noqa: E402
from worker.organise.evolution import evolve_namespace  # noqa: E402
from worker.settings import WorkerSettings  # noqa: E402

XSS = "<script>alert(1)</script> and <img src=x onerror=alert(2)>"


@pytest.fixture
def proposing(redis_db, tmp_path: Path) -> Iterator[WorkerContext]:
    """A namespace with notes, one of them hostile markup, and one pending proposal."""
    settings = make_settings(tmp_path, sequence_weight=0.0, evolution="propose")
    ctx = WorkerContext.build(settings)
    with MemoryClient(settings) as mem:
        for nid, (content, tags) in SEED.items():
            mem.store(content, namespace=NS, tags=tags, id=nid)
        mem.store(XSS, namespace=NS, id="xss")
        drain_all(ctx)
    assert evolve_namespace(ctx, NS) == 1
    yield ctx
    ctx.close()


def served(settings: WorkerSettings, review: bool) -> Iterator[str]:
    app = create_app(settings, extra_mounts={"/graph": live_app(settings, review=review)})
    return uvicorn_serving(app)


def test_the_page_needs_a_token_that_may_read_and_escapes_stored_text(
    proposing: WorkerContext,
) -> None:
    tokens = TokenStore.from_settings(proposing.settings)
    reader, _ = tokens.create(read=[NS])
    other, _ = tokens.create(read=["elsewhere"])
    with served(proposing.settings, review=False) as url, httpx.Client(base_url=url) as web:
        assert web.get(f"/graph/{NS}").status_code == 401
        assert web.get(f"/graph/{NS}", params={"token": "zq_bogus"}).status_code == 401
        forbidden = web.get(f"/graph/{NS}", params={"token": other})
        assert forbidden.status_code == 403 and "Snowflake" not in forbidden.text
        page = web.get(f"/graph/{NS}", params={"token": reader})
        assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
        assert "Snowflake warehouse" in page.text and "<script>alert" not in page.text
        assert '<section id="zq-review"' not in page.text  # read-only unless --review
        by_header = web.get(f"/graph/{NS}", headers={"Authorization": f"Bearer {reader}"})
        assert by_header.status_code == 200
        seeded = web.get(f"/graph/{NS}", params={"token": reader, "seed": "a", "hops": 1})
        assert seeded.status_code == 200
        assert web.get(f"/graph/{NS}", params={"token": reader, "seed": "nope"}).status_code == 404
        assert web.get(f"/graph/{NS}", params={"token": reader, "hops": "x"}).status_code == 422
        assert web.post(f"/graph/{NS}/proposals/p/accept", data={"token": reader}).status_code in (
            404,
            405,
        )  # no review routes


def test_review_accepts_and_rejects_through_the_page_forms(proposing: WorkerContext) -> None:
    tokens = TokenStore.from_settings(proposing.settings)
    writer, _ = tokens.create(read=[NS], write=[NS])
    reader, _ = tokens.create(read=[NS])
    with MemoryClient(proposing.settings) as mem:
        (pending,) = mem.proposals(NS, status="pending")
        with served(proposing.settings, review=True) as url, httpx.Client(base_url=url) as web:
            read_only = web.get(f"/graph/{NS}", params={"token": reader})
            assert pending.id in read_only.text and "<form" not in read_only.text
            page = web.get(f"/graph/{NS}", params={"token": writer})
            actions = re.findall(r'<form method="post" action="([^"]+)"', page.text)
            assert f"/graph/{NS}/proposals/{pending.id}/accept" in actions
            assert "form-action 'self'" in page.text
            refused = web.post(f"/graph/{NS}/proposals/{pending.id}/accept", data={"token": reader})
            assert refused.status_code == 403
            done = web.post(f"/graph/{NS}/proposals/{pending.id}/accept", data={"token": writer})
            assert done.status_code == 303 and done.headers["location"].startswith(f"/graph/{NS}?")
            assert mem.proposals(NS, status="applied")[0].id == pending.id
            again = web.post(f"/graph/{NS}/proposals/{pending.id}/reject", data={"token": writer})
            assert again.status_code == 409  # no longer pending
            after = web.get(f"/graph/{NS}", params={"token": writer})
            assert "no pending proposals" in after.text
