"""Sentinel URLs (producer/urls.py), the clients built from them (producer/connection.py, no
server needed: a client asks the sentinels only when it connects), the broker's kombu form and
ZQ_WAIT_REPLICAS's checks."""

from __future__ import annotations

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import SentinelConnectionPool

from producer.connection import connect, connect_async, data_redis
from producer.errors import InvalidSetting
from producer.settings import ProducerSettings
from producer.urls import is_cluster_url, is_sentinel_url, sentinel_options
from worker.settings import WorkerSettings

SENTINEL = "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/3"


@pytest.mark.parametrize(
    ("url", "sentinel"),
    [
        (SENTINEL, True),
        ("rediss+sentinel://h:26379/m", True),
        ("REDIS+SENTINEL://h:26379/m", True),
        ("redis+cluster://h:7000", False),
        ("redis://127.0.0.1:6379/0", False),
    ],
)
def test_a_sentinel_url_is_named_by_its_scheme(url: str, sentinel: bool) -> None:
    assert is_sentinel_url(url) is sentinel
    assert not (is_sentinel_url(url) and is_cluster_url(url))


def test_a_sentinel_url_gives_its_sentinels_service_db_credentials_and_tls() -> None:
    assert sentinel_options("rediss+sentinel://alice:p%40ss@10.0.0.1:26379,[::1]:26380/m/2") == {
        "sentinels": [("10.0.0.1", 26379), ("::1", 26380)],
        "service_name": "m",
        "db": 2,
        "ssl": True,
        "username": "alice",
        "password": "p@ss",
    }
    assert sentinel_options("redis+sentinel://h:26379/m") == {
        "sentinels": [("h", 26379)],
        "service_name": "m",
        "db": 0,
        "ssl": False,
    }


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "ends in /service_name[/db]"),
        ("redis+sentinel://h:26379/m/x", "ends in /service_name[/db]"),
        ("redis+sentinel://h:26379/m/1/2", "ends in /service_name[/db]"),
        ("redis+sentinel://h/m", "lists sentinels as host:port"),
        ("redis+sentinel://h:26379,/m", "lists sentinels as host:port"),
        ("redis+sentinel://h:26379/m?ssl=1", "takes no query options"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_naming_the_variable(url: str, says: str) -> None:
    with pytest.raises(InvalidSetting, match="redis_url") as caught:
        ProducerSettings(redis_url=url)
    assert says in str(caught.value)
    with pytest.raises(InvalidSetting, match="ZQ_REDIS_URL"):
        sentinel_options(url)
    with pytest.raises(InvalidSetting, match="ZQ_BROKER_URL") as caught:
        WorkerSettings(broker_url=url)
    assert says in str(caught.value)


def test_the_clients_ask_the_sentinels_for_the_master_with_the_urls_options() -> None:
    url = "redis+sentinel://alice:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster/3"
    sync = connect(url, socket_timeout=2.0, socket_connect_timeout=1.0)
    pool = sync.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster"
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "alice", "pw")
    asked = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in asked] == [26379, 26380]
    for sentinel in asked:  # a sentinel gets the timeouts, never the master's password
        assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == 2.0
        assert sentinel.connection_pool.connection_kwargs["password"] is None
    aio = connect_async(url, socket_connect_timeout=1.0)
    assert isinstance(aio.connection_pool, AsyncSentinelPool)
    assert aio.connection_pool.connection_kwargs["db"] == 3
    for sentinel in aio.connection_pool.sentinel_manager.sentinels:
        assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == 1.0


def test_a_sentinel_broker_is_given_to_celery_in_kombus_form_with_the_master_name() -> None:
    settings = WorkerSettings(
        redis_url="redis://127.0.0.1:6379/0",
        broker_url="redis+sentinel://:p%2Fw@10.0.0.1:26379,10.0.0.2:26379/mymaster/1",
        socket_timeout_s=3.0,
    )
    assert settings.broker == (
        "sentinel://:p%2Fw@10.0.0.1:26379/1;sentinel://:p%2Fw@10.0.0.2:26379/1"
    )
    assert settings.broker_transport_options == {
        "master_name": "mymaster",
        "sentinel_kwargs": {"socket_timeout": 3.0, "socket_connect_timeout": 3.0},
    }
    url, options = settings.redbeat_redis
    assert url.startswith("redis-sentinel")
    assert options["sentinels"] == [("10.0.0.1", 26379), ("10.0.0.2", 26379)]
    assert (options["service_name"], options["db"], options["password"]) == ("mymaster", 1, "p/w")


def test_a_plain_broker_keeps_its_url_and_no_options() -> None:
    plain = WorkerSettings(redis_url="redis://a:6379/1")
    assert (plain.broker, plain.broker_transport_options) == ("redis://a:6379/1", {})
    assert plain.redbeat_redis == ("redis://a:6379/1", {})
    inherited = WorkerSettings(redis_url=SENTINEL)
    assert inherited.broker.startswith("sentinel://10.0.0.1:26379/3;")


def test_wait_replicas_is_refused_on_a_cluster_and_with_a_timeout_past_the_sockets() -> None:
    with pytest.raises(InvalidSetting, match="not supported on a Redis Cluster"):
        ProducerSettings(redis_url="redis+cluster://h:7000", wait_replicas=1)
    with pytest.raises(InvalidSetting, match="below ZQ_SOCKET_TIMEOUT_S"):
        ProducerSettings(wait_replicas=1, wait_replicas_timeout_s=5.0, socket_timeout_s=5.0)
    assert ProducerSettings(redis_url=SENTINEL, wait_replicas=1).wait_replicas == 1
    assert ProducerSettings(redis_url="redis+cluster://h:7000").wait_replicas == 0


def test_the_sentinels_get_zq_sentinel_password_and_no_retries_of_their_own() -> None:
    settings = ProducerSettings(redis_url=SENTINEL, sentinel_password="s3cret")
    for sentinel in data_redis(settings).connection_pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        assert kwargs["password"] == "s3cret" and kwargs["retry"].get_retries() == 0
    broker = WorkerSettings(redis_url=SENTINEL, sentinel_password="s3cret")
    assert broker.broker_transport_options["sentinel_kwargs"]["password"] == "s3cret"
    assert broker.redbeat_redis[1]["sentinel_kwargs"]["password"] == "s3cret"
    plain = ProducerSettings(redis_url="redis://127.0.0.1:6379/0", sentinel_password="s3cret")
    assert "sentinel_password" not in data_redis(plain).connection_pool.connection_kwargs
