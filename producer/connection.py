"""The one place a data Redis client is built from the settings, sync and async, on a single
Redis, a Redis watched by Sentinel, or a Redis Cluster.

``ZQ_REDIS_URL`` names a single Redis as redis-py does (``redis://``, ``rediss://``,
``unix://``) or a cluster as ``redis+cluster://[user:password@]host:port[,host:port...]``
(``rediss+cluster://`` for TLS): the nodes are only where the client first asks for the
cluster's layout, one is enough, more survive one being down. A cluster has only database 0,
so a path other than ``/`` or ``/0`` is refused. A master watched by Sentinel is
``redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]``
(``rediss+sentinel://`` for TLS): the hosts are the sentinels, asked for the master's address
whenever a connection is made, so after a failover the client's next connections reach the new
master (and a demoted master's READONLY drops the connection); the user and password are the
master's, the sentinels' password is ``ZQ_SENTINEL_PASSWORD`` (the ``sentinel_password``
option of ``connect``).
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from producer.core import async_redis_kwargs, redis_kwargs
from producer.errors import Unavailable
from producer.settings import ProducerSettings
from producer.urls import cluster_options, is_cluster_url, is_sentinel_url, sentinel_options

#: the connection options a sentinel is asked with too (the rest are the master's)
SENTINEL_OPTIONS = ("socket_timeout", "socket_connect_timeout", "ssl")


class SentinelRedis(Redis):  # type: ignore[misc]  # redis-py's client is untyped here
    """The client of a master found through Sentinel: closing it closes its sentinels' too."""

    def close(self) -> None:
        super().close()
        for sentinel in self.connection_pool.sentinel_manager.sentinels:
            sentinel.close()


class AsyncSentinelRedis(AsyncRedis):  # type: ignore[misc]  # as SentinelRedis
    """The asyncio twin of SentinelRedis."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.connection_pool.sentinel_manager.sentinels:
            await sentinel.aclose()


def connect(url: str, **kwargs: Any) -> Redis | RedisCluster:
    """A client of the Redis or the Redis Cluster that ``url`` names, with ``kwargs`` (the
    connection options of producer.core.redis_kwargs, socket_timeout...). A cluster client
    reads the cluster's layout at once: Unavailable when no node listed answers. A Sentinel
    URL gives a client of the master whose connections ask the sentinels where it is."""
    if is_sentinel_url(url):
        return _sentinel_master(Sentinel, SentinelRedis, Retry(NoBackoff(), 0), url, kwargs)
    if not is_cluster_url(url):
        return Redis.from_url(url, **kwargs)
    options = cluster_options(url)
    nodes = [ClusterNode(host, port) for host, port in options.pop("startup_nodes")]
    try:
        return RedisCluster(startup_nodes=nodes, **options, **kwargs)
    except RedisClusterException as exc:
        raise Unavailable(f"Redis Cluster unavailable: {exc}") from exc


def connect_async(url: str, **kwargs: Any) -> AsyncRedis | AsyncRedisCluster:
    """The asyncio twin of ``connect`` (whose client reads the cluster's layout on first use)."""
    if is_sentinel_url(url):
        return _sentinel_master(
            AsyncSentinel, AsyncSentinelRedis, AsyncRetry(NoBackoff(), 0), url, kwargs
        )
    if not is_cluster_url(url):
        return AsyncRedis.from_url(url, **kwargs)
    options = cluster_options(url)
    nodes = [AsyncClusterNode(host, port) for host, port in options.pop("startup_nodes")]
    return AsyncRedisCluster(startup_nodes=nodes, **options, **kwargs)


def _sentinel_master(
    kind: Any, redis_class: type, once: Any, url: str, kwargs: dict[str, Any]
) -> Any:
    """The master client of a Sentinel URL: a ``kind`` (Sentinel or its asyncio twin) asks the
    URL's sentinels with the client's timeouts (its connect timeout as the read timeout when
    none is given, so a sentinel that stops answering cannot hang a call), TLS, and ``once``, a
    retry policy of no retries: a sentinel that fails is passed over for the next, and the
    master client's own retries (ZQ_REDIS_RETRIES) ask them all again; redis-py's default would
    retry each with back-off up to 10 s. The master gets ``kwargs`` with the URL's db,
    credentials and TLS."""
    options = sentinel_options(url)
    kwargs = dict(kwargs)
    asked = {k: kwargs[k] for k in SENTINEL_OPTIONS if k in kwargs}
    asked["retry"] = once
    password = kwargs.pop("sentinel_password", None)
    if password is not None:
        asked["password"] = password
    if "socket_connect_timeout" in asked:
        asked.setdefault("socket_timeout", asked["socket_connect_timeout"])
    master = {**kwargs, "db": options["db"]}
    for name in ("username", "password"):
        if name in options:
            master[name] = options[name]
    if options["ssl"]:
        asked["ssl"] = master["ssl"] = True
    sentinel = kind(options["sentinels"], sentinel_kwargs=asked)
    return sentinel.master_for(options["service_name"], redis_class=redis_class, **master)


def data_redis(settings: ProducerSettings, **kwargs: Any) -> Redis | RedisCluster:
    """The client of the data store ``settings.redis_url`` names, with zettelq's connection
    options (producer.core.redis_kwargs) and ``kwargs`` (socket_timeout...)."""
    return connect(
        settings.redis_url, **redis_kwargs(settings), **_sentinel_auth(settings), **kwargs
    )


def async_data_redis(settings: ProducerSettings, **kwargs: Any) -> AsyncRedis | AsyncRedisCluster:
    """The asyncio twin of ``data_redis``, whose ``kwargs`` may also replace zettelq's options
    (``retry``...)."""
    options = {**async_redis_kwargs(settings), **_sentinel_auth(settings), **kwargs}
    return connect_async(settings.redis_url, **options)


def _sentinel_auth(settings: ProducerSettings) -> dict[str, str]:
    """``sentinel_password`` for a Sentinel URL when ZQ_SENTINEL_PASSWORD is set."""
    if settings.sentinel_password is None or not is_sentinel_url(settings.redis_url):
        return {}
    return {"sentinel_password": settings.sentinel_password.get_secret_value()}
