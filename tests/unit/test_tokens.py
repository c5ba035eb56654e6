"""GrantCache, the policy of a door's cached grants: it serves only while live, a grant only
while fresh and for its own secret, and a read that raced a drop, start or stop fills nothing."""

from __future__ import annotations

import pytest

from producer.adapters.tokens import Grant, GrantCache, digest

SECRET = "zq_0123456789abcdef_" + "s" * 43
GRANT = Grant(
    token_id="0123456789abcdef", label="", read=frozenset({"a"}), write=frozenset(), created_at=1.0
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> GrantCache:
    cache = GrantCache(5.0, clock)
    cache.start()
    return cache


def fill(cache: GrantCache) -> None:
    cache.put(cache.ticket(), GRANT, digest(SECRET).encode())


def test_a_kept_grant_admits_its_secret_and_no_other(cache: GrantCache) -> None:
    fill(cache)

    cached = cache.get(GRANT.token_id)

    assert cached is not None
    assert cached.admit(SECRET) == GRANT
    assert cached.admit(SECRET[:-1] + "t") is None


def test_nothing_is_served_or_kept_before_start(clock: Clock) -> None:
    cache = GrantCache(5.0, clock)

    assert cache.ticket() is None
    fill(cache)
    cache.start()

    assert cache.get(GRANT.token_id) is None


def test_stop_empties_the_cache_and_a_restart_begins_empty(cache: GrantCache) -> None:
    fill(cache)

    cache.stop()
    assert not cache.live and cache.get(GRANT.token_id) is None and cache.ticket() is None
    cache.start()

    assert cache.live and cache.get(GRANT.token_id) is None


def test_a_grant_expires_after_max_age(cache: GrantCache, clock: Clock) -> None:
    fill(cache)
    clock.now += 4.9
    assert cache.get(GRANT.token_id) is not None

    clock.now += 0.1

    assert cache.get(GRANT.token_id) is None


def test_drop_forgets_one_token(cache: GrantCache) -> None:
    other = GRANT.model_copy(update={"token_id": "fedcba9876543210"})
    fill(cache)
    cache.put(cache.ticket(), other, b"x")

    cache.drop(GRANT.token_id)

    assert cache.get(GRANT.token_id) is None and cache.get(other.token_id) is not None


def test_a_read_that_raced_a_drop_of_any_token_keeps_nothing(cache: GrantCache) -> None:
    ticket = cache.ticket()

    cache.drop("fedcba9876543210")
    cache.put(ticket, GRANT, digest(SECRET).encode())

    assert cache.get(GRANT.token_id) is None


def test_a_read_that_raced_a_lost_subscription_keeps_nothing(cache: GrantCache) -> None:
    ticket = cache.ticket()

    cache.stop()
    cache.start()
    cache.put(ticket, GRANT, digest(SECRET).encode())

    assert cache.get(GRANT.token_id) is None


def test_a_read_that_raced_a_resubscription_keeps_nothing(cache: GrantCache) -> None:
    ticket = cache.ticket()

    cache.start()
    cache.put(ticket, GRANT, digest(SECRET).encode())

    assert cache.get(GRANT.token_id) is None
