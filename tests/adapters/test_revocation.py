"""The grant cache of the HTTP API against a real Redis and a real uvicorn: a cached token costs
no Redis read, a revoke from another client is refused once its PUBLISH arrives, a revoke made
while the subscription is down holds at once (every request reads Redis until it is back), and
ZQ_TOKEN_CACHE_S bounds how long a record changed behind zettelq's back is served."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

pytest.importorskip("fastapi", reason="the HTTP API needs zettelq[server]")
pytest.importorskip("uvicorn", reason="the HTTP API needs zettelq[server]")
httpx = pytest.importorskip("httpx", reason="the HTTP tests drive the API with httpx")

from redis import Redis  # noqa: E402

from producer.adapters.http import create_app  # noqa: E402
from producer.adapters.tokens import TokenStore  # noqa: E402
from tests.adapters.conftest import eventually, token_reads, uvicorn_serving  # noqa: E402
from tests.conftest import make_settings  # noqa: E402
from worker.settings import WorkerSettings  # noqa: E402

NOTES = "/v1/namespaces/a/notes"
LONG_S = 600.0  #: a cache age no test waits for: only a revocation ends a grant within a test


@contextmanager
def served(settings: WorkerSettings) -> Iterator[httpx.Client]:
    with uvicorn_serving(create_app(settings)) as url, httpx.Client(base_url=url) as api:
        yield api


@pytest.fixture
def api(settings: WorkerSettings) -> Iterator[httpx.Client]:
    with served(settings.model_copy(update={"token_cache_s": LONG_S})) as api:
        yield api


def storer(api: httpx.Client, secret: str):
    def store() -> int:
        return api.post(NOTES, json={"content": "x"}, headers=auth(secret)).status_code

    return store


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def until_cached(redis_db: Redis, api: httpx.Client, secret: str) -> None:
    store = storer(api, secret)
    eventually(lambda: token_reads(redis_db, store) == 0, "the token's grant is cached")


def test_a_revoked_cached_token_is_refused_once_the_publish_arrives(
    api: httpx.Client, tokens: TokenStore, redis_db: Redis
) -> None:
    secret, grant = tokens.create(write=["a"])
    other, _ = tokens.create(write=["a"])
    until_cached(redis_db, api, secret)
    until_cached(redis_db, api, other)

    assert tokens.revoke(grant.token_id)

    eventually(lambda: storer(api, secret)() == 401, "the revoked token is refused")
    assert storer(api, secret)() == 401
    assert token_reads(redis_db, storer(api, other)) == 0  # the other grant stays cached


def test_a_wrong_secret_for_a_cached_token_id_is_refused(
    api: httpx.Client, tokens: TokenStore, redis_db: Redis
) -> None:
    secret, _ = tokens.create(write=["a"])
    until_cached(redis_db, api, secret)
    forged = secret[:-1] + ("A" if secret[-1] != "A" else "B")

    assert storer(api, forged)() == 401
    assert storer(api, secret)() == 202


@pytest.fixture
def door_user(redis_db: Redis) -> Iterator[str]:
    """A Redis user for the door, allowed every key, command and channel; deleted afterwards."""
    name = f"door-{uuid.uuid4().hex[:8]}"
    redis_db.acl_setuser(
        name, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all"]
    )
    yield name
    redis_db.acl_deluser(name)


def as_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:pw@{parts.hostname}:{parts.port}"))


def test_while_the_subscription_is_down_a_revoke_holds_at_once_and_the_cache_comes_back(
    settings: WorkerSettings, tokens: TokenStore, redis_db: Redis, door_user: str
) -> None:
    door_url = as_user(settings.redis_url, door_user)
    door = settings.model_copy(update={"redis_url": door_url, "token_cache_s": LONG_S})
    with served(door) as api:
        secret, grant = tokens.create(write=["a"])
        until_cached(redis_db, api, secret)

        # the door may no longer subscribe, and its subscription is killed: it reads every token
        redis_db.acl_setuser(door_user, enabled=True, reset_channels=True)
        redis_db.client_kill_filter(_type="pubsub")
        store = storer(api, secret)
        eventually(lambda: token_reads(redis_db, store) == 1, "the door reads the token again")
        assert token_reads(redis_db, store) == 1

        assert tokens.revoke(grant.token_id)
        assert store() == 401

        redis_db.acl_setuser(door_user, enabled=True, channels=["*"])
        fresh, _ = tokens.create(write=["a"])
        until_cached(redis_db, api, fresh)


def test_a_record_changed_behind_zettelqs_back_holds_after_the_age_bound(
    tokens: TokenStore, redis_db: Redis, tmp_path: Path
) -> None:
    with served(make_settings(tmp_path, key_prefix=tokens.keys.prefix, token_cache_s=0.2)) as api:
        secret, grant = tokens.create(write=["a"])
        until_cached(redis_db, api, secret)

        redis_db.hset(tokens.keys.token(grant.token_id), "write", json.dumps(["b"]))

        eventually(lambda: storer(api, secret)() == 403, "the narrowed grant is seen")


def test_with_no_cache_every_request_reads_its_token(
    tokens: TokenStore, redis_db: Redis, tmp_path: Path
) -> None:
    with served(make_settings(tmp_path, key_prefix=tokens.keys.prefix, token_cache_s=0)) as api:
        secret, _ = tokens.create(write=["a"])

        assert [token_reads(redis_db, storer(api, secret)) for _ in range(20)] == [1] * 20
