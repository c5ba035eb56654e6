"""The HTTP API on a Redis Cluster keeps no grant cache (producer/adapters/revocation.py says
why): every request reads its token, so a revoke holds from the next request on."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the HTTP API needs zettelq[server]")
pytest.importorskip("uvicorn", reason="the HTTP API needs zettelq[server]")
httpx = pytest.importorskip("httpx", reason="the HTTP tests drive the API with httpx")

from producer.adapters.http import create_app  # noqa: E402
from producer.adapters.tokens import TokenStore  # noqa: E402
from tests.adapters.conftest import uvicorn_serving  # noqa: E402
from worker.settings import WorkerSettings  # noqa: E402


def test_a_revoke_holds_from_the_next_request_on_a_cluster(
    cluster_settings: WorkerSettings,
) -> None:
    with (
        TokenStore.from_settings(cluster_settings) as tokens,
        uvicorn_serving(create_app(cluster_settings)) as url,
        httpx.Client(base_url=url) as api,
    ):
        secret, grant = tokens.create(write=["a"])
        headers = {"Authorization": f"Bearer {secret}"}

        def store() -> int:
            return api.post(
                "/v1/namespaces/a/notes", json={"content": "x"}, headers=headers
            ).status_code

        assert [store() for _ in range(5)] == [202] * 5
        assert tokens.revoke(grant.token_id)
        assert store() == 401
