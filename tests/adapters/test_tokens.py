"""Bearer tokens against the real Redis: the secret is shown once and only its hash is kept; a
grant names exact namespaces (or ``*``); revoked, unknown, malformed or tampered tokens
authenticate nobody."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from redis import Redis
from redis import asyncio as aioredis

from producer.adapters.tokens import AsyncTokenStore, Grant, TokenStore
from producer.errors import InvalidInput, ProtocolError
from worker.settings import WorkerSettings


def test_a_created_token_checks_to_its_grant(tokens: TokenStore) -> None:
    secret, grant = tokens.create(read=["a", "b"], write=["a"], label="agent one")

    assert tokens.check(secret) == grant
    assert grant.read == {"a", "b"} and grant.write == {"a"} and grant.label == "agent one"
    assert grant.can_read("b") and not grant.can_write("b") and not grant.can_read("c")


def test_only_the_sha256_of_the_secret_is_stored(
    tokens: TokenStore, settings: WorkerSettings, redis_db: Redis
) -> None:
    secret, grant = tokens.create(read=["a"])

    stored = redis_db.hgetall(f"{settings.key_prefix}:token:{grant.token_id}")
    assert stored[b"sha256"] == hashlib.sha256(secret.encode()).hexdigest().encode()
    dump = b"".join(k + v for key in redis_db.keys("*") for k, v in _fields(redis_db, key))
    assert secret.encode() not in dump


def _fields(r: Redis, key: bytes) -> list[tuple[bytes, bytes]]:
    if r.type(key) == b"hash":
        return list(r.hgetall(key).items())
    return [(m, b"") for m in r.smembers(key)] if r.type(key) == b"set" else []


def test_a_star_grant_reads_and_writes_any_namespace(tokens: TokenStore) -> None:
    _, grant = tokens.create(read=["*"], write=["*"])

    assert grant.can_read("anything") and grant.can_write("x/y")


def test_a_grant_is_exact_not_a_prefix(tokens: TokenStore) -> None:
    _, grant = tokens.create(read=["team"], write=["team"])

    assert not grant.can_read("team/sub") and not grant.can_read("tea")
    assert not grant.can_write("team2")


def test_revoked_and_unknown_tokens_check_to_none(tokens: TokenStore) -> None:
    secret, grant = tokens.create(write=["a"])
    other, _ = tokens.create(write=["a"])

    assert tokens.revoke(grant.token_id) is True
    assert tokens.check(secret) is None
    assert tokens.revoke(grant.token_id) is False
    assert tokens.check(other) is not None


def test_a_secret_with_a_known_id_but_other_random_part_is_refused(tokens: TokenStore) -> None:
    secret, _ = tokens.create(read=["a"])
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")

    assert tokens.check(forged) is None


@pytest.mark.parametrize(
    "secret", ["", "zq_", "Bearer x", "zq_0123456789abcdef_short", "x" * 10_000, "zq_\x00"]
)
def test_malformed_secrets_check_to_none(tokens: TokenStore, secret: str) -> None:
    assert tokens.check(secret) is None


def test_list_shows_every_token_oldest_first_without_secrets(tokens: TokenStore) -> None:
    _, first = tokens.create(read=["a"], label="first")
    _, second = tokens.create(write=["b"], label="second")

    assert tokens.list() == [first, second]
    tokens.revoke(first.token_id)
    assert tokens.list() == [second]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("read", "not json"),
        ("read", '"a"'),
        ("write", "[1, 2]"),
        ("write", '["bad{ns}"]'),
        ("created_at", "nan"),
        ("created_at", "soon"),
        ("label", "\x1b[31m"),
        ("read", b"\xff\xfe"),
    ],
)
def test_a_malformed_record_authenticates_nobody_and_is_skipped(
    tokens: TokenStore, redis_db: Redis, settings: WorkerSettings, field: str, value: object
) -> None:
    secret, grant = tokens.create(read=["a"], write=["a"])
    _, good = tokens.create(read=["b"])
    redis_db.hset(f"{settings.key_prefix}:token:{grant.token_id}", field, value)  # type: ignore[arg-type]

    assert tokens.check(secret) is None
    assert tokens.list() == [good]
    assert tokens.revoke(grant.token_id) is True


def test_a_record_missing_a_field_authenticates_nobody(
    tokens: TokenStore, redis_db: Redis, settings: WorkerSettings
) -> None:
    secret, grant = tokens.create(read=["a"])
    redis_db.hdel(f"{settings.key_prefix}:token:{grant.token_id}", "write")

    assert tokens.check(secret) is None


def test_odd_members_of_the_token_set_are_ignored(
    tokens: TokenStore, redis_db: Redis, settings: WorkerSettings
) -> None:
    _, grant = tokens.create(read=["a"])
    redis_db.sadd(f"{settings.key_prefix}:tokens", b"\xff", "0123456789abcdef", "../x")

    assert tokens.list() == [grant]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one namespace"),
        ({"read": "abc"}, "must be a list"),
        ({"read": ["bad{ns}"]}, "namespace must be"),
        ({"write": [7]}, "namespace must be"),
        ({"read": ["a"], "label": "x" * 201}, "label must be"),
        ({"read": ["a"], "label": "tab\there"}, "printable"),
        ({"read": [f"n{i}" for i in range(300)]}, "the limit is 256"),
    ],
)
def test_bad_grants_are_refused_and_nothing_is_written(
    tokens: TokenStore, redis_db: Redis, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        tokens.create(**kwargs)  # type: ignore[arg-type]

    assert tokens.list() == []
    assert redis_db.dbsize() == 0


def test_revoke_of_an_odd_id_is_false(tokens: TokenStore) -> None:
    assert tokens.revoke("../../etc") is False
    assert tokens.revoke("0123456789abcdef") is False


def test_the_grant_is_frozen(tokens: TokenStore) -> None:
    _, grant = tokens.create(read=["a"])

    with pytest.raises(ValueError, match="frozen"):
        grant.label = "changed"  # type: ignore[misc]


def test_grants_are_stored_as_json_lists(
    tokens: TokenStore, redis_db: Redis, settings: WorkerSettings
) -> None:
    _, grant = tokens.create(read=["b", "a", "a"], write=["*"])

    raw = redis_db.hgetall(f"{settings.key_prefix}:token:{grant.token_id}")
    assert json.loads(raw[b"read"]) == ["a", "b"] and json.loads(raw[b"write"]) == ["*"]


def test_the_async_store_checks_like_the_sync_one(
    tokens: TokenStore, settings: WorkerSettings
) -> None:
    secret, grant = tokens.create(read=["a"])

    async def check(secret: str) -> Grant | None:
        async with aioredis.Redis.from_url(settings.redis_url) as r:
            return await AsyncTokenStore(r, settings.key_prefix).check(secret)

    assert asyncio.run(check(secret)) == grant
    assert asyncio.run(check(secret + "x")) is None
    tokens.revoke(grant.token_id)
    assert asyncio.run(check(secret)) is None
    with Redis.from_url(settings.redis_url) as r:
        r.set(f"{settings.key_prefix}:token:{grant.token_id}", "not a hash")
    assert asyncio.run(check(secret)) is None


def test_a_token_key_of_another_type_authenticates_nobody(
    tokens: TokenStore, redis_db: Redis, settings: WorkerSettings
) -> None:
    secret, grant = tokens.create(read=["a"])
    _, good = tokens.create(read=["b"])
    key = f"{settings.key_prefix}:token:{grant.token_id}"
    redis_db.delete(key)
    redis_db.set(key, "not a hash")

    assert tokens.check(secret) is None
    assert tokens.list() == [good]


def test_a_token_set_of_another_type_is_a_protocol_error(
    tokens: TokenStore, redis_db: Redis, settings: WorkerSettings
) -> None:
    redis_db.set(f"{settings.key_prefix}:tokens", "x")

    with pytest.raises(ProtocolError, match="is not a set"):
        tokens.list()
