"""Which doors cache grants (producer/adapters/revocation.py): every one but those with
ZQ_TOKEN_CACHE_S=0 and those on a Redis Cluster, whose pub/sub client could not tell when it
stopped listening."""

from __future__ import annotations

import pytest

from producer.adapters.revocation import grant_cache
from producer.settings import ProducerSettings


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "redis+sentinel://127.0.0.1:26379/zq", "unix:///run/r.sock"],
)
def test_a_door_on_one_redis_or_sentinel_caches_for_the_set_age(url: str) -> None:
    cache = grant_cache(ProducerSettings(redis_url=url, token_cache_s=2.5))

    assert cache is not None and cache.max_age_s == 2.5 and not cache.live


@pytest.mark.parametrize(
    ("url", "age_s"),
    [("redis://127.0.0.1:6379/0", 0.0), ("redis+cluster://127.0.0.1:7000", 5.0)],
)
def test_no_cache_with_an_age_of_0_or_on_a_cluster(url: str, age_s: float) -> None:
    assert grant_cache(ProducerSettings(redis_url=url, token_cache_s=age_s)) is None
