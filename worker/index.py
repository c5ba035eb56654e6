"""VectorIndex: a namespace's FAISS projection of note vectors. The only module that imports faiss.

Vectors are L2-normalised on the way in, so a score is the cosine similarity (inner product).
Every vector is keyed by the note's int64 ``seq``; a seq appears at most once.

- **flat** (exact): ``IndexIDMap2(IndexFlatIP)`` keyed by seq. Removal is a real removal.
- **ivf** (approximate, the default): ``IndexIVFScalarQuantizer`` keyed by seq, with about
  2·sqrt(n) inverted lists (at most one per ``IVF_POINTS_PER_LIST`` vectors) trained by k-means
  on the vectors present when it is built; a search scans the ``nprobe`` lists nearest the query.
  The lists hold the vectors as float16 (not residuals): a scan reads half the bytes of float32
  lists and costs about 40% less (a batch of 256 queries at 100k, 256-d: 17 against 27 ms), with
  the same recall; a score is off the float32 cosine by about 1e-3 at most.
  Adding a vector costs one pass over the list centroids, and removal is a real removal. Once
  the index holds ``IVF_REGROW`` times more (or fewer) vectors than it was trained on, it is
  rebuilt and retrained, so the lists keep their size as a namespace grows.
- **hnsw** (approximate, opt-in): ``IndexHNSWFlat`` addressed by row position.
  ``_Hnsw.row_seq`` maps a row to its seq, or -1 once removed. HNSW cannot drop rows, so
  removed rows are filtered out during the search itself (an ``IDSelectorBitmap`` of live
  rows), which still returns k live results where k exist. When removed rows exceed
  ``COMPACT_FRACTION`` of the index, it is rebuilt from the vectors FAISS already stores.

The index starts flat and is rebuilt as the approximate kind (``ann``) once more than
``ann_threshold`` vectors are live; a rebuild that leaves ``ann_threshold`` or fewer makes it
flat again. IVF inserts cost far less than HNSW ones (about 0.01 against 0.4 ms per vector at
100k, 256-d, one thread), which is what ingest pays for; HNSW answers single queries faster.

On disk a snapshot is one file, replaced atomically: an npy header, the npy row -> seq array
(empty for flat) and the ``faiss.write_index`` bytes. A snapshot is a cache: Redis is the truth.
Not thread-safe; each worker process owns its indexes and runs FAISS on one thread.
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
import time
from typing import Literal, Protocol, TypeGuard

import faiss
import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

faiss.omp_set_num_threads(1)

Kind = Literal["flat", "ivf", "hnsw"]
Ann = Literal["ivf", "hnsw"]
Floats = npt.NDArray[np.float32]
Seqs = npt.NDArray[np.int64]

#: rebuild an HNSW index once removed rows exceed this fraction of its rows
COMPACT_FRACTION = 0.2
#: IVF: lists per sqrt(n) vectors, and at least this many vectors per list (k-means needs ~39)
IVF_LISTS_PER_SQRT = 2
IVF_POINTS_PER_LIST = 39
#: IVF: k-means trains on a sample of this many vectors per list (bounds the retraining pause)
IVF_TRAIN_POINTS_PER_LIST = 40
#: IVF: rebuild (and retrain) once the live count is this many times above or below the count
#: the index was trained on
IVF_REGROW = 4
#: IVF: k-means iterations when training the lists
IVF_TRAIN_ITERATIONS = 10
#: IVF: how the lists store vectors (float16; see the module docstring)
IVF_CODES = faiss.ScalarQuantizer.QT_fp16
#: version of the snapshot layout written by VectorIndex.save
FORMAT_VERSION = 3
HEADER_FIELDS = 10  #: int64 fields of the snapshot header (see VectorIndex._header)
_KIND_CODES: dict[Kind, int] = {"flat": 0, "hnsw": 1, "ivf": 2}


class IndexCorrupt(Exception):
    """The index snapshot is missing or unreadable; rebuild it from Redis."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__)


class _Backend(Protocol):
    kind: Kind

    @property
    def index(self) -> faiss.Index: ...
    @property
    def row_seq(self) -> Seqs: ...  # row -> seq, saved with the snapshot; empty for flat

    def __len__(self) -> int: ...
    def __contains__(self, seq: int) -> bool: ...
    def add(self, seqs: Seqs, vecs: Floats) -> None: ...
    def remove(self, seqs: Seqs) -> None: ...
    def search(self, vecs: Floats, k: int) -> tuple[Floats, Seqs]: ...
    def export(self) -> tuple[Seqs, Floats]: ...
    def needs_rebuild(self) -> bool: ...


class _SeqKeyed:
    """A FAISS index whose ids are the seqs themselves (flat and IVF), with the live seqs kept
    beside it. ``add`` takes new seqs only, ``remove`` present ones."""

    index: faiss.Index
    _seqs: set[int]

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, seq: int) -> bool:
        return seq in self._seqs

    def add(self, seqs: Seqs, vecs: Floats) -> None:
        self.index.add_with_ids(vecs, seqs)
        self._seqs.update(seqs.tolist())

    def remove(self, seqs: Seqs) -> None:
        self.index.remove_ids(faiss.IDSelectorBatch(seqs))
        self._seqs.difference_update(seqs.tolist())

    def search(self, vecs: Floats, k: int) -> tuple[Floats, Seqs]:
        return self.index.search(vecs, k)


class _Flat(_SeqKeyed):
    """Exact search."""

    index: faiss.IndexIDMap2

    kind: Kind = "flat"

    def __init__(self, index: faiss.IndexIDMap2) -> None:
        self.index = index
        self.row_seq: Seqs = np.empty(0, dtype=np.int64)
        self._seqs: set[int] = set(faiss.vector_to_array(index.id_map).tolist())

    @classmethod
    def empty(cls, dim: int) -> _Flat:
        return cls(faiss.IndexIDMap2(faiss.IndexFlatIP(dim)))

    def export(self) -> tuple[Seqs, Floats]:
        seqs: Seqs = faiss.vector_to_array(self.index.id_map)
        vecs: Floats = self.index.index.reconstruct_n(0, self.index.ntotal)
        return seqs, vecs

    def needs_rebuild(self) -> bool:
        return False


class _Ivf(_SeqKeyed):
    """Approximate search over inverted lists. ``trained_on`` is the live count the lists were
    trained for."""

    index: faiss.IndexIVFScalarQuantizer
    kind: Kind = "ivf"

    def __init__(self, index: faiss.IndexIVFScalarQuantizer, trained_on: int) -> None:
        self.index = index
        self.trained_on = trained_on
        self.row_seq: Seqs = np.empty(0, dtype=np.int64)
        self._seqs: set[int] = set(self._lists(vectors=False)[0].tolist())

    @classmethod
    def trained(cls, vecs: Floats, nprobe: int) -> _Ivf:
        """An empty index whose lists are trained on ``vecs`` (not added)."""
        n, dim = vecs.shape
        nlist = max(1, min(int(IVF_LISTS_PER_SQRT * n**0.5), n // IVF_POINTS_PER_LIST))
        index = faiss.IndexIVFScalarQuantizer(
            faiss.IndexFlatIP(dim), dim, nlist, IVF_CODES, faiss.METRIC_INNER_PRODUCT, False
        )
        index.cp.niter = IVF_TRAIN_ITERATIONS
        index.cp.max_points_per_centroid = IVF_TRAIN_POINTS_PER_LIST
        index.cp.seed = 1234
        index.train(vecs)
        index.nprobe = nprobe
        return cls(index, n)

    def export(self) -> tuple[Seqs, Floats]:
        return self._lists()

    def needs_rebuild(self) -> bool:
        n = len(self)
        return n > IVF_REGROW * self.trained_on or n * IVF_REGROW < self.trained_on

    def _lists(self, vectors: bool = True) -> tuple[Seqs, Floats]:
        """Every stored seq and (unless ``vectors`` is False) its vector, read from the inverted
        lists; without vectors the second array is empty."""
        lists, dim = self.index.invlists, self.index.d
        assert lists is not None, "an IVF index owns its lists"
        seqs: list[Seqs] = [np.empty(0, dtype=np.int64)]
        vecs: list[Floats] = [np.empty((0, dim), dtype=np.float32)]
        for i in range(lists.nlist):
            size = lists.list_size(i)
            if size:
                seqs.append(faiss.rev_swig_ptr(lists.get_ids(i), size).copy())
                if not vectors:
                    continue
                codes = faiss.rev_swig_ptr(lists.get_codes(i), size * lists.code_size)
                vecs.append(self.index.sq.decode(codes.reshape(size, lists.code_size)))
        return np.concatenate(seqs), np.concatenate(vecs)


class _Hnsw:
    """Approximate search; FAISS labels are rows, ``row_seq[row]`` is a seq or -1 (removed)."""

    kind: Kind = "hnsw"

    def __init__(self, index: faiss.IndexHNSWFlat, row_seq: Seqs) -> None:
        self.index = index
        self.row_seq = row_seq
        self._row_of = {seq: row for row, seq in enumerate(row_seq.tolist()) if seq >= 0}
        self._params: faiss.SearchParameters | None = None  # built lazily, reset on change
        self._live_bitmap: npt.NDArray[np.uint8] | None = None  # memory the params point into

    @classmethod
    def empty(cls, dim: int, m: int, ef_construction: int, ef_search: int) -> _Hnsw:
        index = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
        return cls(index, np.empty(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self._row_of)

    def __contains__(self, seq: int) -> bool:
        return seq in self._row_of

    def set_ef_search(self, value: int) -> None:
        self.index.hnsw.efSearch = value
        self._params = None

    def add(self, seqs: Seqs, vecs: Floats) -> None:
        first = len(self.row_seq)
        self.index.add(vecs)
        self.row_seq = np.concatenate([self.row_seq, seqs])
        self._row_of.update(zip(seqs.tolist(), range(first, len(self.row_seq)), strict=True))
        self._params = None

    def remove(self, seqs: Seqs) -> None:
        rows = [self._row_of.pop(seq) for seq in seqs.tolist()]
        self.row_seq[rows] = -1
        self._params = None

    def search(self, vecs: Floats, k: int) -> tuple[Floats, Seqs]:
        scores, rows = self.index.search(vecs, k, params=self._search_params())
        seqs: Seqs = np.where(rows >= 0, self.row_seq[rows], -1)
        return scores, seqs

    def _search_params(self) -> faiss.SearchParameters | None:
        """None when every row is live, else parameters that skip removed rows while searching."""
        if len(self) == len(self.row_seq):
            return None
        if self._params is None:
            self._live_bitmap = np.packbits(self.row_seq >= 0, bitorder="little")
            bitmap = faiss.swig_ptr(self._live_bitmap)  # n is the bitmap's length in bytes
            selector = faiss.IDSelectorBitmap(len(self._live_bitmap), bitmap)
            # Missing from faiss 1.15's stub. It defaults to efSearch=16, not the index's value.
            self._params = faiss.SearchParametersHNSW(  # type: ignore[attr-defined]
                sel=selector, efSearch=self.index.hnsw.efSearch
            )
        return self._params

    def export(self) -> tuple[Seqs, Floats]:
        live_rows = np.flatnonzero(self.row_seq >= 0).astype(np.int64)
        return self.row_seq[live_rows], self.index.reconstruct_batch(live_rows)

    def needs_rebuild(self) -> bool:
        return len(self.row_seq) - len(self) > COMPACT_FRACTION * len(self.row_seq)


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
        self._backend: _Backend = _Flat.empty(dim)

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
        if isinstance(self._backend, _Hnsw):
            self._backend.set_ef_search(value)

    @property
    def nprobe(self) -> int:
        """IVF lists scanned per query (recall against speed); settable, takes effect at once."""
        return self._nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self._nprobe = value
        if isinstance(self._backend, _Ivf):
            self._backend.index.nprobe = value

    def add(self, seqs: npt.NDArray[np.int64], vecs: npt.NDArray[np.float32]) -> None:
        """Add or replace vectors; within one batch the last vector for a seq wins."""
        ids, x = _as_seqs(seqs), self._as_vectors(vecs)
        if len(ids) != len(x):
            raise ValueError(f"{len(ids)} seqs for {len(x)} vectors")
        ids, x = _last_wins(ids, x)
        self._remove_present(ids)
        self._backend.add(ids, x)
        self._maybe_rebuild()

    def remove(self, seqs: npt.NDArray[np.int64]) -> None:
        """Remove vectors by seq; unknown seqs are ignored."""
        self._remove_present(np.unique(_as_seqs(seqs)))
        self._maybe_rebuild()

    def search(
        self, vecs: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Best k per query, best first, as (scores, seqs) of shape (n, k).

        Where fewer than k live vectors are found, seqs are padded with -1 and scores with -inf.
        """
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        scores, seqs = self._backend.search(self._as_vectors(vecs), k)
        scores[seqs < 0] = -np.inf
        return scores, seqs

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

    def _header(self) -> npt.NDArray[np.int64]:
        trained = self._backend.trained_on if isinstance(self._backend, _Ivf) else 0
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

    def _remove_present(self, seqs: Seqs) -> None:
        present = np.fromiter((s for s in seqs.tolist() if s in self._backend), dtype=np.int64)
        if len(present):
            self._backend.remove(present)

    def _maybe_rebuild(self) -> None:
        grown = self.kind == "flat" and len(self) > self.ann_threshold
        if grown or self._backend.needs_rebuild():
            self._rebuild()

    def _rebuild(self) -> None:
        """Re-create the index from its live vectors, choosing the kind by the live count."""
        started = time.perf_counter()
        seqs, vecs = self._backend.export()
        backend: _Backend
        if len(seqs) > self.ann_threshold and self.ann == "ivf":
            backend = _Ivf.trained(vecs, self._nprobe)
        elif len(seqs) > self.ann_threshold:
            backend = _Hnsw.empty(self.dim, self.hnsw_m, self.ef_construction, self._ef_search)
        else:
            backend = _Flat.empty(self.dim)
        backend.add(seqs, vecs)
        log.info(
            "index rebuilt kind=%s from=%s n=%d in %.1fms",
            backend.kind,
            self.kind,
            len(seqs),
            (time.perf_counter() - started) * 1000,
        )
        self._backend = backend


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


def _backend_from(kind_code: int, index: faiss.Index, row_seq: object, trained: int) -> _Backend:
    if kind_code == _KIND_CODES["flat"] and isinstance(index, faiss.IndexIDMap2):
        return _Flat(index)
    if kind_code == _KIND_CODES["ivf"] and trained > 0:
        if isinstance(index, faiss.IndexIVFScalarQuantizer):
            return _Ivf(index, trained)
        raise IndexCorrupt("index snapshot holds another kind of IVF index")
    if kind_code != _KIND_CODES["hnsw"] or not isinstance(index, faiss.IndexHNSWFlat):
        raise IndexCorrupt("index snapshot does not match its header")
    if not _is_array(row_seq, (index.ntotal,)):
        raise IndexCorrupt("index snapshot rows do not match the index")
    return _Hnsw(index, row_seq)
