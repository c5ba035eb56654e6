"""The Redis server a process runs on, checked when a worker, searcher, ``zettelq dev`` or the
demo starts.

A server older than Redis 7.0 is refused (``require_supported``): the drain reads XAUTOCLAIM's
reply in its 7.0 shape. Everything else is advice (``advice``), logged once as a warning per gap,
so an operator running their own Redis learns that it can lose notes (an evicting
``maxmemory-policy``, no AOF) or costs more than the benchmarks say (small listpack values).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import PurePath

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from worker.errors import UnsupportedRedis

log = logging.getLogger(__name__)

#: The oldest Redis zettelq runs on (every Valkey, 7.2 and later, reports redis_version >= 7.2).
MIN_VERSION = (7, 0)
#: What in zettelq needs MIN_VERSION, named in the refusal.
NEEDS_MIN_VERSION = (
    "XAUTOCLAIM's three-element reply (7.0), which the drain reads to reclaim a dead worker's"
    " entries"
)
#: A hash keeps the compact listpack encoding only while every value fits under the server's
#: bound. A packed link (weight, reason, label, source, time) is ~90 bytes, and a note's largest
#: field is its vector (4 bytes per dimension: 1,024 at the default 256) or its content: at 2048
#: a note of the default embedder with up to ~2 KB of text is a listpack too, 1.3 KB smaller
#: than as a hashtable (bench/README.md, "Redis memory per note").
LISTPACK_VALUE = 2048
#: The data dir of a server whose owner deletes it on stop (tests, the demo, ``dev --ephemeral``):
#: no AOF is right there, so advice() does not ask for it.
THROWAWAY_DIR_PREFIX = "zq-throwaway-"
#: The server settings advice() reads.
ADVISED = ("appendonly", "dir", "maxmemory", "maxmemory-policy", "hash-max-listpack-value")


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version such as ``7.0.15``; ValueError if text has none."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    return int(match[1]), int(match[2])


def describe(info: Mapping[str, object]) -> str:
    """The server as its INFO server section names it: ``Redis 7.0.15``, ``Valkey 9.1.2 (Redis
    7.2.4)``."""
    redis_version = str(info.get("redis_version", "?"))
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']} (Redis {redis_version})"
    return f"Redis {redis_version}"


def require_supported(r: Redis) -> None:
    """Raise UnsupportedRedis unless the server reports redis_version >= MIN_VERSION.

    A user not allowed INFO, or a server that reports no version, is let through (logged): the
    drain then fails on its own if the server is too old.
    """
    try:
        info = r.info("server")
    except ResponseError as exc:  # NOPERM: this user may not run INFO
        log.info("cannot read INFO server (%s); not checking the Redis version", exc)
        return
    if "redis_version" not in info:
        log.info("INFO server reports no redis_version; not checking the Redis version")
        return
    if parse_version(str(info["redis_version"])) < MIN_VERSION:
        host, port = _address(r)
        raise UnsupportedRedis(
            f"{describe(info)} at {host}:{port} is too old: zettelq needs Redis >="
            f" {'.'.join(map(str, MIN_VERSION))} (or any Valkey) for {NEEDS_MIN_VERSION}"
        )


def _address(r: Redis) -> tuple[str, str]:
    kwargs = r.connection_pool.connection_kwargs
    return str(kwargs.get("host", kwargs.get("path", "?"))), str(kwargs.get("port", ""))


def advice(r: Redis) -> list[str]:
    """What to change in the server's configuration (empty when nothing, or when CONFIG GET is
    not allowed to this user)."""
    try:
        found: dict[str, str] = {}
        for name in ADVISED:
            found.update(r.config_get(name))
    except RedisError:
        return []
    lines = [
        _eviction_advice(found),
        _memory_advice(found),
        _aof_advice(found),
        _listpack_advice(found),
    ]
    return [line for line in lines if line]


def _eviction_advice(found: Mapping[str, str]) -> str:
    policy = found.get("maxmemory-policy", "noeviction")
    if policy == "noeviction":
        return ""
    return (
        f"Redis has maxmemory-policy {policy}: at its memory limit it deletes keys on its own,"
        " notes and queued jobs among them, without an error to anyone; set noeviction"
        " (deploy/redis.conf)"
    )


def _memory_advice(found: Mapping[str, str]) -> str:
    unbounded = found.get("maxmemory") == "0"
    if not unbounded or found.get("maxmemory-policy", "noeviction") != "noeviction":
        return ""
    if _throwaway(found):
        return ""
    return (
        "Redis has noeviction but no maxmemory: it grows until the host runs out of memory and "
        "the kernel kills it, losing what AOF had not yet written; set maxmemory so that a full "
        "Redis refuses writes instead (producer.OutOfMemory; deploy/redis.conf)"
    )


def _throwaway(found: Mapping[str, str]) -> bool:
    return PurePath(found.get("dir", "")).name.startswith(THROWAWAY_DIR_PREFIX)


def _aof_advice(found: Mapping[str, str]) -> str:
    if found.get("appendonly") != "no" or _throwaway(found):
        return ""
    return (
        "Redis has appendonly no: it holds the only copy of the notes, and a crash or "
        "restart loses every write since its last snapshot; turn AOF on (deploy/redis.conf)"
    )


def _listpack_advice(found: Mapping[str, str]) -> str:
    value = found.get("hash-max-listpack-value")
    if value is None or int(value) >= LISTPACK_VALUE:
        return ""
    return (
        f"Redis has hash-max-listpack-value {value}: note hashes (and under 256 links hashes) "
        f"use the hashtable encoding, which costs ~1.3 KB more memory per note (links "
        f"hashes: ~25% more Redis CPU per organised note); set it to {LISTPACK_VALUE} "
        f"(deploy/redis.conf)"
    )


def check_at_start(r: Redis | RedisCluster) -> None:
    """Refuse a server older than MIN_VERSION (UnsupportedRedis), then log each advice() line as
    a warning; on a Redis Cluster, for each primary. Called once per process that serves
    (worker main process, searcher)."""
    for server in servers(r):
        require_supported(server)
        for line in advice(server):
            log.warning("%s", line)


def servers(r: Redis | RedisCluster) -> list[Redis]:
    """``r`` itself, or a client of each primary of a Redis Cluster."""
    if isinstance(r, RedisCluster):
        return [r.get_redis_connection(node) for node in r.get_primaries()]
    return [r]
