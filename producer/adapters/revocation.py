"""The subscription that keeps a door's GrantCache (producer/adapters/tokens.py) true to the
tokens revoked, for the lifespan of an ASGI app (the HTTP API, MCP over HTTP).

``following(settings, cache)`` runs ``follow`` in a task. It SUBSCRIBEs to ``P:tokens:changed``
on a connection of its own and starts the cache when Redis confirms the subscription (from then
on every revoke's PUBLISH reaches it), drops a token's grant for each message (the id that
``TokenStore.revoke`` publishes in the transaction that deletes the token), and stops the cache
as soon as the connection fails or is closed (``CLIENT KILL``, a restart, a failover). While the
cache is stopped, every request reads its token from Redis; the next confirmed subscription
starts it empty, so a revoke published while nobody listened is never answered from the cache.
It resubscribes after a pause, RESUBSCRIBE_S doubling up to RESUBSCRIBE_MAX_S.

The revocation window is the delivery of the PUBLISH: milliseconds. A connection that dies
without closing (a network partition: nothing tells the subscriber) is the exception, bounded
by ZQ_TOKEN_CACHE_S, the age at which every cached grant is read from Redis again; so is a
token record changed or deleted behind zettelq's back. On a Sentinel URL the subscription is on
the master the sentinels name: a demoted master still receives the new master's PUBLISHes
through replication, and one that fails closes the connection.

A Redis Cluster gets no cache (``grant_cache`` is None): a PUBLISH reaches every node over the
cluster bus, but redis-py's asyncio ClusterPubSub picks its node and reconnects by itself, so
this subscriber could not tell when it stopped listening, which the cache's correctness rests
on. Every request on a cluster reads its token as without a cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from producer.adapters.tokens import GrantCache
from producer.connection import async_data_redis
from producer.keys import Keys
from producer.settings import ProducerSettings
from producer.urls import is_cluster_url

log = logging.getLogger(__name__)

RESUBSCRIBE_S = 0.1  #: pause before resubscribing after a confirmed subscription is lost
RESUBSCRIBE_MAX_S = 2.0  #: longest pause between failed attempts (doubling from RESUBSCRIBE_S)


def grant_cache(settings: ProducerSettings) -> GrantCache | None:
    """The cache of a door, or None with ZQ_TOKEN_CACHE_S=0 or on a Redis Cluster (see above)."""
    if settings.token_cache_s == 0 or is_cluster_url(settings.redis_url):
        return None
    return GrantCache(settings.token_cache_s)


@asynccontextmanager
async def following(settings: ProducerSettings, cache: GrantCache | None) -> AsyncIterator[None]:
    """``follow`` in a task of its own while the body runs (nothing to do without a cache)."""
    if cache is None:
        yield
        return
    # no retries: a failed read must reach follow at once, which stops the cache
    once = AsyncRetry(NoBackoff(), 0)
    redis = async_data_redis(settings, socket_timeout=settings.socket_timeout_s, retry=once)
    if not isinstance(redis, AsyncRedis):
        raise TypeError("grants are not cached on a Redis Cluster (see grant_cache)")
    channel = Keys(settings.key_prefix).tokens_changed()
    task = asyncio.create_task(follow(cache, redis, channel))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await redis.aclose()


async def follow(cache: GrantCache, redis: AsyncRedis, channel: str) -> None:
    """Keep ``cache`` true to ``channel`` until cancelled, resubscribing after each failure."""
    pause = RESUBSCRIBE_S
    while True:
        confirmed = await listen(cache, redis, channel)
        pause = RESUBSCRIBE_S if confirmed else min(2 * pause, RESUBSCRIBE_MAX_S)
        await asyncio.sleep(pause)


async def listen(cache: GrantCache, redis: AsyncRedis, channel: str) -> bool:
    """Serve ``cache`` from one subscription until it fails; whether Redis had confirmed it."""
    pubsub = redis.pubsub()
    confirmed = False
    try:
        await pubsub.subscribe(channel)
        while True:
            message = await pubsub.get_message(timeout=None)
            if message is None:  # the answer to a health check
                continue
            if message["type"] == "subscribe":
                cache.start()
                confirmed = True
                log.info("token changes: subscribed channel=%s, grants are cached", channel)
            elif message["type"] == "message":
                cache.drop(message["data"].decode(errors="replace"))
    except (RedisError, OSError) as exc:
        if confirmed:
            log.warning("token changes: subscription lost, every token is read from Redis: %s", exc)
        else:
            log.debug("token changes: cannot subscribe: %s", exc)
        return confirmed
    finally:
        cache.stop()
        await pubsub.aclose()
