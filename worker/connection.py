"""The data Redis and its keys, for code that needs no embedder and no projections (the
operator commands, the graph explorer and export), and the name a process goes by. Light: it
imports no worker extra, so the commands that use it run on a base install."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from redis import Redis

from producer.connection import data_redis
from producer.keys import Keys
from worker.settings import WorkerSettings


@dataclass
class Streams:
    """The data Redis and its keys, without the embedder and projections of a WorkerContext."""

    redis: Redis
    keys: Keys


@contextmanager
def streams(settings: WorkerSettings) -> Iterator[Streams]:
    redis = data_redis(settings, socket_timeout=settings.socket_timeout_s)
    try:
        yield Streams(redis, Keys.of(settings))
    finally:
        redis.close()


def new_consumer() -> str:
    """A name for this process that no other process has: ``<host>-<pid>-<random hex>``."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
