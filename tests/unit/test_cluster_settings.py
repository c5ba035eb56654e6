"""Redis Cluster URLs (producer/urls.py), the broker's refusal of one, and the keys a cluster
deployment names differently (only the search lists, which then share one hash tag)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from producer.errors import InvalidSetting
from producer.keys import Keys
from producer.settings import ProducerSettings
from producer.urls import cluster_options, is_cluster_url
from tests.unit.test_keys import GLOBAL_KEYS, NAMESPACE_KEYS, SHARD_KEYS, hash_tag
from worker.settings import WorkerSettings

CLUSTER = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"


@pytest.mark.parametrize(
    ("url", "cluster"),
    [
        (CLUSTER, True),
        ("rediss+cluster://h:7000", True),
        ("REDIS+CLUSTER://h:7000", True),
        ("redis://127.0.0.1:6379/0", False),
        ("rediss://h:6380", False),
        ("unix:///run/redis.sock", False),
    ],
)
def test_a_cluster_is_named_by_its_scheme(url: str, cluster: bool) -> None:
    assert is_cluster_url(url) is cluster
    assert ProducerSettings(redis_url=url).redis_cluster is cluster


def test_a_cluster_url_gives_its_nodes_user_password_and_tls() -> None:
    options = cluster_options("rediss+cluster://alice:p%40ss@10.0.0.1:7000,[::1]:7001/0")
    assert options == {
        "startup_nodes": [("10.0.0.1", 7000), ("::1", 7001)],
        "ssl": True,
        "username": "alice",
        "password": "p@ss",
    }
    assert cluster_options("redis+cluster://h:7000/") == {
        "startup_nodes": [("h", 7000)],
        "ssl": False,
    }


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://u:secret@h:7000/3", "only database 0, got /3"),
        ("redis+cluster://u:secret@h", "lists nodes as host:port"),
        ("redis+cluster://h:7000,h:notaport", "got 'h:notaport'"),
        ("redis+cluster://h:70000", "got 'h:70000'"),
        ("redis+cluster://h:7000?ssl_cert_reqs=none", "takes no query options"),
    ],
)
def test_a_malformed_cluster_url_is_refused_naming_the_setting(url: str, message: str) -> None:
    with pytest.raises(InvalidSetting, match="redis_url") as raised:
        ProducerSettings(redis_url=url)
    assert message in str(raised.value)
    assert "secret" not in str(raised.value)
    with pytest.raises(InvalidSetting, match="ZQ_REDIS_URL"):
        cluster_options(url)


def test_a_cluster_given_as_broker_is_refused_naming_zq_broker_url(tmp_path) -> None:
    with pytest.raises(InvalidSetting, match="ZQ_BROKER_URL names a Redis Cluster"):
        WorkerSettings(broker_url=CLUSTER, index_dir=tmp_path)


def test_a_cluster_data_store_needs_a_broker_of_its_own(tmp_path) -> None:
    settings = WorkerSettings(redis_url=CLUSTER, index_dir=tmp_path)
    with pytest.raises(InvalidSetting, match="ZQ_BROKER_URL is unset"):
        _ = settings.broker
    apart = WorkerSettings(redis_url=CLUSTER, broker_url="redis://b:6379/0", index_dir=tmp_path)
    assert apart.broker == "redis://b:6379/0"
    plain = WorkerSettings(redis_url="redis://a:6379/1", index_dir=tmp_path)
    assert plain.broker == "redis://a:6379/1"


def test_on_a_cluster_the_search_lists_share_one_hash_tag() -> None:
    keys = Keys("zq", 8, cluster=True)
    lists = [keys.shard_search(s) for s in range(8)] + [keys.search_queue()]
    assert {hash_tag(k) for k in lists} == {"search"}
    assert keys.search_queue_of(["a"]) == keys.shard_search(keys.shard_of("a"))
    assert keys.search_queue_of(["a", "b"]) == "zq:{search}"
    assert Keys.of(ProducerSettings(redis_url=CLUSTER)).cluster


@pytest.mark.parametrize("make", NAMESPACE_KEYS)
def test_namespace_keys_are_named_alike_on_a_cluster(make: Callable[[Keys, str], str]) -> None:
    assert make(Keys("zq", cluster=True), "ns") == make(Keys("zq"), "ns")


@pytest.mark.parametrize("make", [k for k in SHARD_KEYS if k is not Keys.shard_search])
def test_shard_keys_are_named_alike_on_a_cluster(make: Callable[[Keys, int], str]) -> None:
    assert make(Keys("zq", cluster=True), 3) == make(Keys("zq"), 3)


@pytest.mark.parametrize("make", [k for k in GLOBAL_KEYS if k is not Keys.search_queue])
def test_global_keys_are_named_alike_on_a_cluster(make: Callable[[Keys], str]) -> None:
    assert make(Keys("zq", cluster=True)) == make(Keys("zq"))


def test_a_single_redis_keeps_the_search_lists_it_always_had() -> None:
    keys = Keys.of(ProducerSettings(redis_url="redis://h:6379/0"))
    assert (keys.shard_search(3), keys.search_queue()) == ("zq:{s3}:search", "zq:search")
