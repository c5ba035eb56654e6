"""WorkerContext: what every stage needs, built once per worker process."""

from __future__ import annotations

import gc
import os
import socket
import threading
from dataclasses import dataclass, field

from redis import Redis

from producer.core import redis_kwargs
from producer.keys import Keys
from worker.embedding import Embedder
from worker.model_embedding import build_embedder
from worker.projection import Projection, open_projection
from worker.settings import WorkerSettings

#: Python's youngest GC generation is collected once this many more container objects were
#: allocated than freed (Python's default is 700). A batch allocates hundreds of thousands of
#: short-lived ones; at 700 they outlive two collections, reach the oldest generation and set
#: off full collections, each a scan of every projection (about 90 ms at 100k notes). At the
#: default, ingest of 100k notes spent 14 of its 75 s in the collector; at this value, 0.2 s.
GC_YOUNG_THRESHOLD = 100_000


@dataclass
class WorkerContext:
    """Settings, the data Redis, the embedder and this process's projections."""

    settings: WorkerSettings
    redis: Redis
    keys: Keys
    embedder: Embedder
    consumer: str
    projections: dict[str, Projection] = field(default_factory=dict)
    #: namespace -> change-log position of the projection this process last snapshotted
    snapshots: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, settings: WorkerSettings) -> WorkerContext:
        """The context of a worker or searcher process; also sets the process's GC threshold."""
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
        redis = Redis.from_url(
            settings.redis_url, socket_timeout=settings.socket_timeout_s, **redis_kwargs(settings)
        )
        return cls(
            settings=settings,
            redis=redis,
            keys=Keys(settings.key_prefix, settings.shard_count),
            embedder=build_embedder(settings),
            consumer=f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}",
        )

    def projection(self, ns: str) -> Projection:
        """This process's projection of ``ns``, opened on first use (not yet caught up)."""
        with self._lock:
            proj = self.projections.get(ns)
        if proj is not None:
            return proj
        opened = open_projection(self, ns)
        with self._lock:
            return self.projections.setdefault(ns, opened)

    def close(self) -> None:
        self.redis.close()
