"""A Redis cache of vectors keyed by (embedder name, SHA-256 of the text), so that no text is
embedded twice while its entry lives: not on a redelivered job, not on a re-store of the same
content, not in another namespace, not when re-embedding.

Entries are plain strings (``Keys.vcache``) written with SET EX ``vector_cache_ttl_s``; lookups
are one pipelined round trip of GETs rather than an MGET, so the keys may live on different
Redis Cluster slots. The embedder name is part of the key, so two models never share entries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
from redis import Redis

from producer.keys import Keys
from worker.models.hashing import Embedder
from worker.settings import WorkerSettings

Vector = npt.NDArray[np.float32]


class Holder(Protocol):
    """What the cache needs: the data Redis, its keys, the settings and the embedder (a
    WorkerContext is one)."""

    @property
    def redis(self) -> Redis: ...

    @property
    def keys(self) -> Keys: ...

    @property
    def settings(self) -> WorkerSettings: ...

    @property
    def embedder(self) -> Embedder: ...


def embed_cached(ctx: Holder, texts: Sequence[str]) -> Vector:
    """Embed ``texts`` with ``ctx.embedder``, calling it once for the distinct texts the cache
    lacks (not at all when every text is cached), and caching what it returns."""
    ttl_s = ctx.settings.vector_cache_ttl_for
    if ttl_s == 0 or not texts:
        return ctx.embedder.embed(texts)
    name = ctx.embedder.name
    keys = [ctx.keys.vcache(name, _sha256(text)) for text in texts]
    out = np.empty((len(texts), ctx.embedder.dim), dtype=np.float32)
    missing = _read(ctx.redis, keys, out)
    if missing:
        rows = [found[0] for found in missing.values()]
        vecs = ctx.embedder.embed([texts[row] for row in rows])
        store = ctx.redis.pipeline(transaction=False)
        for key, vec in zip(missing, vecs, strict=True):
            out[missing[key]] = vec
            store.set(key, vec.tobytes(), ex=ttl_s)
        store.execute()
    return out


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _read(r: Redis, keys: list[str], out: Vector) -> dict[str, list[int]]:
    """Fill the rows of ``out`` the cache holds; return each missing key with its rows."""
    lookup = r.pipeline(transaction=False)
    for key in keys:
        lookup.get(key)
    missing: dict[str, list[int]] = {}
    for row, (key, raw) in enumerate(zip(keys, lookup.execute(), strict=True)):
        if raw is not None and len(raw) == out.shape[1] * out.itemsize:
            out[row] = np.frombuffer(raw, dtype=np.float32)
        else:
            missing.setdefault(key, []).append(row)
    return missing
