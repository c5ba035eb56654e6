"""WorkerContext: what every stage needs, built once per worker process."""

from __future__ import annotations

import gc
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Self

from redis import Redis

from producer.connection import data_redis
from producer.keys import Keys
from worker.connection import new_consumer
from worker.index.projection import Projection, open_projection
from worker.models.factory import build_embedder
from worker.models.hashing import Embedder
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

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
    #: namespace -> projection, least recently used first
    projections: OrderedDict[str, Projection] = field(default_factory=OrderedDict)
    #: namespace -> change-log position of the projection this process last snapshotted
    snapshots: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, settings: WorkerSettings) -> WorkerContext:
        """The context of a worker or searcher process; also sets the process's GC threshold."""
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
        redis = data_redis(settings, socket_timeout=settings.socket_timeout_s)
        return cls(
            settings=settings,
            redis=redis,
            keys=Keys.of(settings),
            embedder=build_embedder(settings),
            consumer=new_consumer(),
        )

    def projection(self, ns: str) -> Projection:
        """This process's projection of ``ns``, opened on first use (not yet caught up). Opening
        one drops the least recently used others while the projections hold more than
        ``max_projection_notes`` notes; a dropped one is reopened (from its snapshot, or rebuilt
        from Redis) when next needed, and whoever still uses it finishes with it."""
        with self._lock:
            proj = self.projections.get(ns)
            if proj is not None:
                self.projections.move_to_end(ns)
                return proj
        opened = open_projection(self, ns)
        with self._lock:
            proj = self.projections.setdefault(ns, opened)
            self.projections.move_to_end(ns)
            self._shed(keep=ns)
            return proj

    def shed(self, keep: str) -> None:
        """Drop least recently used projections (never ``keep``'s) until the notes they hold fit
        ``max_projection_notes`` again: called after a batch grew ``keep``'s projection."""
        with self._lock:
            self._shed(keep)

    def drop_if_empty(self, ns: str) -> None:
        """Drop the projection of ``ns`` if it holds no note (a namespace searched but never
        written, or emptied): it costs memory and is rebuilt from Redis in no time."""
        with self._lock:
            proj = self.projections.get(ns)
            if proj is not None and not proj.ids:
                del self.projections[ns]

    def held_projections(self) -> dict[str, Projection]:
        """The projections this process holds now, by namespace."""
        with self._lock:
            return dict(self.projections)

    def _shed(self, keep: str) -> None:
        """``shed`` with the lock held."""
        held = sum(len(p.ids) for p in self.projections.values())
        for ns in [n for n in self.projections if n != keep]:
            if held <= self.settings.max_projection_notes:
                return
            held -= len(self.projections.pop(ns).ids)
            log.info("dropped the projection of ns=%s (least recently used)", ns)

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
