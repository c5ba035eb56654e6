"""VectorIndex: a namespace's FAISS projection of note vectors. With worker/index/kinds.py (the
flat, IVF and HNSW indexes it switches between), the only module that imports faiss.

Vectors are L2-normalised on the way in, so a score is the cosine similarity (inner product).
Every vector is keyed by the note's int64 ``seq``; a seq appears at most once.

The index starts flat and is rebuilt as the approximate kind (``ann``) once more than
``ann_threshold`` vectors are live; a rebuild that leaves ``ann_threshold`` or fewer makes it
flat again. IVF inserts cost far less than HNSW ones (about 0.01 against 0.4 ms per vector at
100k, 256-d, one thread), which is what ingest pays for; HNSW answers single queries faster.

A rebuild (to another kind, or an IVF index retrained as it grows or shrinks) runs inside the
``add`` or ``remove`` that makes it due, unless that is called with ``rebuild=False``: then the
owner rebuilds apart (``begin_rebuild`` starts keeping the changes, ``Rebuild.build`` copies
the live vectors taking the owner's lock for each IVF list and builds the new index from them
without touching this one, ``end_rebuild`` applies the changes made meanwhile and swaps), so that
it need not hold its lock for the build (worker/index/projection.py ``Projection.settle``).

On disk a snapshot is one file, replaced atomically: an npy header, the npy row -> seq array
(empty for flat) and the ``faiss.write_index`` bytes. A snapshot is a cache: Redis is the truth.
It is written from a copy taken apart like a rebuild (``copying``: an IVF index's lists read one
at a time under the owner's lock, the changes made meanwhile applied to the copy as it is
finished), so the owner's lock is never held for the whole index.
Not thread-safe, but for ``Rebuild.build`` and ``Copy.read``: they read the index that made them
only holding the owner's lock, and otherwise only the changes the owner appends to their
journals (``Rebuild.build`` reads its own up to its length at the time); each worker process
owns its indexes and runs FAISS on one thread.
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Literal, TypeGuard

import faiss
import numpy as np
import numpy.typing as npt

from worker.errors import IndexCorrupt
from worker.index.kinds import (
    IVF_REGROW,
    Backend,
    Flat,
    Floats,
    Hnsw,
    Hold,
    Ivf,
    Kind,
    Seqs,
)

log = logging.getLogger(__name__)

Change = tuple[Seqs, Floats | None]  #: seqs changed, and their new vectors (None: removed)

faiss.omp_set_num_threads(1)

Ann = Literal["ivf", "hnsw"]

#: version of the snapshot layout written by VectorIndex.save
FORMAT_VERSION = 3
HEADER_FIELDS = 10  #: int64 fields of the snapshot header (see VectorIndex._header)
_KIND_CODES: dict[Kind, int] = {"flat": 0, "hnsw": 1, "ivf": 2}


class VectorIndex:
    """Inner-product index over L2-normalised float32 vectors, keyed by int64 seq (>= 0)."""

    def __init__(
        self,
        dim: int,
        ann_threshold: int = 20_000,
        ann: Ann = "ivf",
        hnsw_m: int = 32,
        ef_search: int = 96,
        ef_construction: int = 80,
        nprobe: int = 8,
    ) -> None:
        if dim < 1 or ann_threshold < 0 or nprobe < 1 or ann not in ("ivf", "hnsw"):
            raise ValueError(
                f"need dim >= 1, ann_threshold >= 0, nprobe >= 1 and ann ivf or hnsw, got "
                f"{dim}, {ann_threshold}, {nprobe}, {ann!r}"
            )
        self.dim = dim
        self.ann_threshold = ann_threshold
        self.ann: Ann = ann
        self.hnsw_m = hnsw_m
        self.ef_construction = ef_construction
        self._ef_search = ef_search
        self._nprobe = nprobe
        self._backend: Backend = Flat.empty(dim)
        #: the changes made since ``begin_rebuild`` (seqs, vectors or None for a removal)
        self._journal: list[Change] | None = None
        self._copies: set[Copy] = set()  #: copies being taken apart, each keeping the changes
        self._due_at: int | None = None  #: the live count when a deferred rebuild became due
        self._begun = 0.0  #: when the open rebuild began (perf_counter)

    def __len__(self) -> int:
        return len(self._backend)

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int | np.integer) and int(seq) in self._backend

    @property
    def kind(self) -> Kind:
        return self._backend.kind

    @property
    def ef_search(self) -> int:
        """HNSW search breadth (recall against speed); settable, takes effect at once."""
        return self._ef_search

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        self._ef_search = value
        if isinstance(self._backend, Hnsw):
            self._backend.set_ef_search(value)

    @property
    def nprobe(self) -> int:
        """IVF lists scanned per query (recall against speed); settable, takes effect at once."""
        return self._nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self._nprobe = value
        if isinstance(self._backend, Ivf):
            self._backend.index.nprobe = value

    def add(
        self, seqs: npt.NDArray[np.int64], vecs: npt.NDArray[np.float32], *, rebuild: bool = True
    ) -> None:
        """Add or replace vectors; within one batch the last vector for a seq wins. With
        ``rebuild=False`` a rebuild this makes due is left to ``begin_rebuild`` (unless the index
        has grown ``IVF_REGROW`` times past the size at which it became due: then it is done)."""
        ids, x = _as_seqs(seqs), self._as_vectors(vecs)
        if len(ids) != len(x):
            raise ValueError(f"{len(ids)} seqs for {len(x)} vectors")
        ids, x = _last_wins(ids, x)
        _replace(self._backend, ids, x)
        self._keep((ids, x))
        self._after_change(rebuild)

    def remove(self, seqs: npt.NDArray[np.int64], *, rebuild: bool = True) -> None:
        """Remove vectors by seq; unknown seqs are ignored. ``rebuild`` as for ``add``."""
        ids = np.unique(_as_seqs(seqs))
        _replace(self._backend, ids, None)
        self._keep((ids, None))
        self._after_change(rebuild)

    def _keep(self, change: Change) -> None:
        """Note a change for the open rebuild and the copies being taken."""
        if self._journal is not None:
            self._journal.append(change)
        for copy in self._copies:
            copy.journal.append(change)

    def rebuild_due(self) -> bool:
        """Whether the index should be rebuilt now (as another kind, or its IVF lists retrained
        for the live count); never while a rebuild begun by ``begin_rebuild`` is open."""
        if self._journal is not None:
            return False
        grown = self.kind == "flat" and len(self) > self.ann_threshold
        return grown or self._backend.needs_rebuild()

    def begin_rebuild(self, hold: Hold) -> Rebuild:
        """Start a rebuild that runs apart from this index (``Rebuild.build``, called without
        ``hold``, the lock the caller changes this index under): it reads the live vectors
        taking ``hold`` (an IVF index's one list at a time) and builds the new index from them,
        while this index goes on serving and taking changes, which it keeps from now on until
        ``end_rebuild`` applies them to the new one (``build`` applies those made while it read
        and built, so that few are left for ``end_rebuild``)."""
        self._journal = []
        self._begun = time.perf_counter()
        return Rebuild(self, self._backend, hold, self._journal)

    def end_rebuild(self, built: Backend | None, replayed: int = 0) -> None:
        """Replace the index by ``built`` with the changes made since ``begin_rebuild`` applied
        to it, in order, from the ``replayed``-th on (``Rebuild.replayed``: the first ones are
        in it already); None (the build failed) keeps the index as it is."""
        journal, self._journal, self._due_at = self._journal or [], None, None
        if built is None:
            return
        for ids, x in journal[replayed:]:
            _replace(built, ids, x)
        log.info(
            "index rebuilt kind=%s from=%s n=%d in %.1fms (apart: drains, searches went on)",
            built.kind,
            self.kind,
            len(built),
            (time.perf_counter() - self._begun) * 1000,
        )
        self._backend = built
        self.nprobe, self.ef_search = self._nprobe, self._ef_search  # as set meanwhile

    def search(
        self, vecs: npt.NDArray[np.float32], k: int, probe_share: float = 0.0
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Best k per query, best first, as (scores, seqs) of shape (n, k). An IVF index scans
        ``nprobe`` lists, or ``probe_share`` of its lists where that is more.

        Where fewer than k live vectors are found, seqs are padded with -1 and scores with -inf.
        """
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        scores, seqs = self._backend.search(self._as_vectors(vecs), k, probe_share)
        scores[seqs < 0] = -np.inf
        return scores, seqs

    @contextmanager
    def copying(self, hold: Hold) -> Iterator[Copy]:
        """An independent copy taken apart from this index (as much memory as the index again),
        so that a snapshot can be written from it while this one goes on changing: ``read``
        (called without ``hold``, the lock the caller changes this index under) copies an IVF
        index's lists taking ``hold`` for one list at a time, and ``finish`` (called holding it)
        applies the changes made since the copy began. Other kinds are copied whole when it
        begins, holding ``hold``."""
        copy = Copy(self, hold)
        try:
            yield copy
        finally:
            with hold:
                self._copies.discard(copy)

    def save(self, path: pathlib.Path) -> None:
        """Write a snapshot atomically: readers see the old file or the new one, never a mix."""
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.lib.format.write_array(f, self._header(), allow_pickle=False)
                np.lib.format.write_array(f, self._backend.row_seq, allow_pickle=False)
                # streamed: no in-memory copy of the index (not in faiss 1.15's stub)
                writer = faiss.PyCallbackIOWriter(f.write)  # type: ignore[attr-defined]
                faiss.write_index(self._backend.index, writer)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            pathlib.Path(tmp_name).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: pathlib.Path) -> VectorIndex:
        """Read a snapshot written by save; raise IndexCorrupt if it is missing or unreadable."""
        try:
            with path.open("rb") as f:
                header = np.lib.format.read_array(f, allow_pickle=False)
                row_seq = np.lib.format.read_array(f, allow_pickle=False)
                reader = faiss.PyCallbackIOReader(f.read)  # type: ignore[attr-defined]
                index = faiss.read_index(reader)
            return cls._from_parts(header, row_seq, index)
        except (OSError, ValueError, EOFError, RuntimeError) as exc:
            raise IndexCorrupt(f"cannot read index snapshot {path}") from exc

    @classmethod
    def _from_parts(cls, header: object, row_seq: object, index: faiss.Index) -> VectorIndex:
        if not _is_array(header, (HEADER_FIELDS,)) or header[0] != FORMAT_VERSION:
            raise IndexCorrupt("unknown index snapshot header")
        fields = header[1:].tolist()
        dim, threshold, ann_code, m, ef_search, ef_construction, nprobe, kind_code, trained = fields
        if index.d != dim or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise IndexCorrupt("index snapshot does not match its header")
        ann: Ann = "hnsw" if ann_code == _KIND_CODES["hnsw"] else "ivf"
        loaded = cls(dim, threshold, ann, m, ef_search, ef_construction, nprobe)
        loaded._backend = _backend_from(kind_code, index, row_seq, trained)
        return loaded

    def _with_backend(self, backend: Backend) -> VectorIndex:
        """An index with this one's settings over ``backend``."""
        made = VectorIndex(
            self.dim,
            self.ann_threshold,
            self.ann,
            self.hnsw_m,
            self._ef_search,
            self.ef_construction,
            self._nprobe,
        )
        made._backend = backend
        return made

    def _header(self) -> npt.NDArray[np.int64]:
        trained = self._backend.trained_on if isinstance(self._backend, Ivf) else 0
        fields = [FORMAT_VERSION, self.dim, self.ann_threshold, _KIND_CODES[self.ann]]
        fields += [self.hnsw_m, self._ef_search, self.ef_construction, self._nprobe]
        fields += [_KIND_CODES[self.kind], trained]
        return np.array(fields, dtype=np.int64)

    def _as_vectors(self, vecs: npt.NDArray[np.float32]) -> Floats:
        """A normalised C-contiguous float32 copy of vecs, which must be (n, dim)."""
        x = np.array(vecs, dtype=np.float32, order="C", copy=True)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {x.shape}")
        faiss.normalize_L2(x)
        return x

    def _after_change(self, rebuild: bool) -> None:
        if not self.rebuild_due():
            self._due_at = None
            return
        if self._due_at is None:
            self._due_at = len(self)
        if rebuild or len(self) >= IVF_REGROW * max(self._due_at, 1):
            self._rebuild()

    def _rebuild(self) -> None:
        """Re-create the index from its live vectors, choosing the kind by the live count."""
        started = time.perf_counter()
        kind = self.kind
        self._backend = Rebuild(self, self._backend, nullcontext(), []).build()
        self._due_at = None
        log.info(
            "index rebuilt kind=%s from=%s n=%d in %.1fms",
            self.kind,
            kind,
            len(self),
            (time.perf_counter() - started) * 1000,
        )


class Rebuild:
    """A new index for ``index`` from the live vectors of ``source`` (its backend when the
    rebuild began), read holding ``hold``, with the changes in ``journal`` (those made since,
    appended by the index's owner) applied as far as they went when it was built; otherwise it
    reads only ``index``'s settings, so ``build`` may run while the index changes
    (``VectorIndex.begin_rebuild``)."""

    def __init__(
        self, index: VectorIndex, source: Backend, hold: Hold, journal: list[Change]
    ) -> None:
        self.index, self.source, self.hold, self.journal = index, source, hold, journal
        self.replayed = 0  #: how many of ``journal``'s changes ``build`` applied

    def build(self) -> Backend:
        """The new index, of the kind the live count asks for (FAISS releases the GIL while it
        decodes, trains and adds). A seq read twice (moved between two IVF lists' reads) is
        added twice: its change is in the journal, whose replay removes every copy first."""
        ix = self.index
        seqs, vecs = self.source.export(self.hold)
        backend: Backend
        if len(seqs) > ix.ann_threshold and ix.ann == "ivf":
            backend = Ivf.trained(vecs, ix.nprobe)
        elif len(seqs) > ix.ann_threshold:
            backend = Hnsw.empty(ix.dim, ix.hnsw_m, ix.ef_construction, ix.ef_search)
        else:
            backend = Flat.empty(ix.dim)
        backend.add(seqs, vecs)
        self.replayed = len(self.journal)  # appended to meanwhile: what was there by now
        for ids, x in self.journal[: self.replayed]:
            _replace(backend, ids, x)
        return backend


class Copy:
    """A copy of ``index`` being taken apart from it (``VectorIndex.copying``): begun holding
    ``hold``, read list by list (``read``), finished with the changes made since it began
    (``finish``)."""

    def __init__(self, index: VectorIndex, hold: Hold) -> None:
        self.index, self.hold = index, hold
        self.journal: list[Change] = []  #: the changes made since it began, appended by ``index``
        with hold:
            index._copies.add(self)
            self.source = index._backend
            self.backend = None if isinstance(self.source, Ivf) else _clone(self.source)

    def read(self) -> None:
        """Copy an IVF index's lists, taking ``hold`` for one list at a time (call without it)."""
        if self.backend is None:
            assert isinstance(self.source, Ivf)
            self.backend = self.source.copy(self.hold)

    def finish(self) -> VectorIndex:
        """The copy as the index is now (call holding ``hold``, after ``read``): the changes made
        since it began applied in order, each removing every copy of its seqs first (a seq that
        moved between two lists' reads was copied twice). Its changes are no longer kept."""
        assert self.backend is not None, "finish() after read()"
        self.index._copies.discard(self)
        for ids, x in self.journal:
            _replace(self.backend, ids, x)
        return self.index._with_backend(self.backend)


def _clone(backend: Backend) -> Backend:
    """A whole copy of a flat or HNSW index (FAISS ``clone_index``)."""
    index = faiss.clone_index(backend.index)
    return _backend_from(_KIND_CODES[backend.kind], index, backend.row_seq.copy(), 0)


def _replace(backend: Backend, ids: Seqs, x: Floats | None) -> None:
    """Remove those of ``ids`` that ``backend`` holds, then add ``x`` under them (if given)."""
    present = np.fromiter((s for s in ids.tolist() if s in backend), dtype=np.int64)
    if len(present):
        backend.remove(present)
    if x is not None:
        backend.add(ids, x)


def _as_seqs(seqs: npt.NDArray[np.int64]) -> Seqs:
    ids = np.ascontiguousarray(seqs, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"expected a 1-d array of seqs, got shape {ids.shape}")
    if (ids < 0).any():
        raise ValueError("seqs must be >= 0 (-1 marks padding)")
    return ids


def _last_wins(seqs: Seqs, vecs: Floats) -> tuple[Seqs, Floats]:
    """Drop earlier duplicates of a seq within one batch, keeping batch order otherwise."""
    if len(np.unique(seqs)) == len(seqs):
        return seqs, vecs
    _, first_from_end = np.unique(seqs[::-1], return_index=True)
    keep = np.sort(len(seqs) - 1 - first_from_end)
    return seqs[keep], vecs[keep]


def _is_array(value: object, shape: tuple[int, ...]) -> TypeGuard[npt.NDArray[np.int64]]:
    return isinstance(value, np.ndarray) and value.dtype == np.int64 and value.shape == shape


def _backend_from(kind_code: int, index: faiss.Index, row_seq: object, trained: int) -> Backend:
    if kind_code == _KIND_CODES["flat"] and isinstance(index, faiss.IndexIDMap2):
        return Flat(index)
    if kind_code == _KIND_CODES["ivf"] and trained > 0:
        if isinstance(index, faiss.IndexIVFScalarQuantizer):
            return Ivf(index, trained)
        raise IndexCorrupt("index snapshot holds another kind of IVF index")
    if kind_code != _KIND_CODES["hnsw"] or not isinstance(index, faiss.IndexHNSWFlat):
        raise IndexCorrupt("index snapshot does not match its header")
    if not _is_array(row_seq, (index.ntotal,)):
        raise IndexCorrupt("index snapshot rows do not match the index")
    return Hnsw(index, row_seq)
