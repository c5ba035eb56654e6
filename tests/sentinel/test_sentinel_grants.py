"""The HTTP API's grant cache through the sentinels (tests/sentinel/conftest.py): its
subscription to revocations is on the master, and after the master is killed and the replica
promoted it subscribes on the new one, whose revokes end cached grants as before."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis import Redis

pytest.importorskip("fastapi", reason="the HTTP API needs zettelq[server]")
pytest.importorskip("uvicorn", reason="the HTTP API needs zettelq[server]")
httpx = pytest.importorskip("httpx", reason="the HTTP tests drive the API with httpx")

from producer.adapters.http import create_app  # noqa: E402
from producer.adapters.tokens import TokenStore  # noqa: E402
from tests.adapters.conftest import eventually, token_reads, uvicorn_serving  # noqa: E402
from tests.sentinel.conftest import LocalSentinel  # noqa: E402
from worker.settings import WorkerSettings  # noqa: E402

pytestmark = pytest.mark.e2e

FAILOVER_S = 60.0  #: how long the door may take to store and cache again after a failover


def test_a_revoke_ends_a_cached_grant_before_and_after_a_failover(
    local_sentinel: LocalSentinel, failover_settings: WorkerSettings
) -> None:
    door = failover_settings.model_copy(update={"token_cache_s": 600.0, "socket_timeout_s": 2.0})
    with (
        TokenStore.from_settings(door) as tokens,
        uvicorn_serving(create_app(door)) as url,
        httpx.Client(base_url=url, timeout=30.0) as api,
    ):

        def storer(secret: str) -> Callable[[], int]:
            headers = {"Authorization": f"Bearer {secret}"}
            return lambda: (
                api.post(
                    "/v1/namespaces/a/notes", json={"content": "x"}, headers=headers
                ).status_code
            )

        def revoked_after_cached(master: Redis, timeout_s: float) -> None:
            secret, grant = tokens.create(write=["a"])
            store = storer(secret)
            cached = lambda: token_reads(master, store) == 0  # noqa: E731
            eventually(cached, "the token's grant is cached", timeout_s)
            assert tokens.revoke(grant.token_id)
            eventually(lambda: store() == 401, "the revoked token is refused")

        revoked_after_cached(Redis(port=local_sentinel.master_port), 15.0)

        local_sentinel.kill(local_sentinel.master_port)
        promoted = local_sentinel.wait_failover()

        revoked_after_cached(Redis(port=promoted), FAILOVER_S)
