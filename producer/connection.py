"""The one place a data Redis client is built from the settings, sync and async, on a single
Redis or on a Redis Cluster.

``ZQ_REDIS_URL`` names a single Redis as redis-py does (``redis://``, ``rediss://``,
``unix://``) or a cluster as ``redis+cluster://[user:password@]host:port[,host:port...]``
(``rediss+cluster://`` for TLS): the nodes are only where the client first asks for the
cluster's layout, one is enough, more survive one being down. A cluster has only database 0,
so a path other than ``/`` or ``/0`` is refused.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from producer.core import async_redis_kwargs, redis_kwargs
from producer.errors import Unavailable
from producer.settings import ProducerSettings
from producer.urls import cluster_options, is_cluster_url


def connect(url: str, **kwargs: Any) -> Redis | RedisCluster:
    """A client of the Redis or the Redis Cluster that ``url`` names, with ``kwargs`` (the
    connection options of producer.core.redis_kwargs, socket_timeout...). A cluster client
    reads the cluster's layout at once: Unavailable when no node listed answers."""
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
    if not is_cluster_url(url):
        return AsyncRedis.from_url(url, **kwargs)
    options = cluster_options(url)
    nodes = [AsyncClusterNode(host, port) for host, port in options.pop("startup_nodes")]
    return AsyncRedisCluster(startup_nodes=nodes, **options, **kwargs)


def data_redis(settings: ProducerSettings, **kwargs: Any) -> Redis | RedisCluster:
    """The client of the data store ``settings.redis_url`` names, with zettelq's connection
    options (producer.core.redis_kwargs) and ``kwargs`` (socket_timeout...)."""
    return connect(settings.redis_url, **redis_kwargs(settings), **kwargs)


def async_data_redis(settings: ProducerSettings, **kwargs: Any) -> AsyncRedis | AsyncRedisCluster:
    """The asyncio twin of ``data_redis``."""
    return connect_async(settings.redis_url, **async_redis_kwargs(settings), **kwargs)
