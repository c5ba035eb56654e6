"""A worker process's projections of Redis, one per namespace, thrown away and rebuilt at will:
the FAISS vector index and the kinds it switches between (``vector``, ``kinds``), BM25 over the
notes (``lexical``), the change log that keeps them current (``changelog``) and the projection
that holds them with its snapshots (``projection``). Nothing here knows the WorkerContext: a
projection reads from any ``Source`` (Redis, keys, settings, the embedder's name and width)."""

from worker.index.changelog import stream_pos
from worker.index.lexical import LexicalIndex
from worker.index.projection import (
    Projection,
    Source,
    catch_up,
    freeze,
    open_projection,
    write_snapshot,
)
from worker.index.vector import Ann, VectorIndex

__all__ = [
    "Ann",
    "LexicalIndex",
    "Projection",
    "Source",
    "VectorIndex",
    "catch_up",
    "freeze",
    "open_projection",
    "stream_pos",
    "write_snapshot",
]
