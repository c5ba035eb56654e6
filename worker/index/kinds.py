"""The FAISS indexes a VectorIndex (worker/index/vector.py) switches between, all inner product over
L2-normalised vectors keyed by the note's int64 seq:

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
  ``Hnsw.row_seq`` maps a row to its seq, or -1 once removed. HNSW cannot drop rows, so
  removed rows are filtered out during the search itself (an ``IDSelectorBitmap`` of live
  rows), which still returns k live results where k exist. When removed rows exceed
  ``COMPACT_FRACTION`` of the index, it is rebuilt from the vectors FAISS already stores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Literal, Protocol

import faiss
import numpy as np
import numpy.typing as npt

Kind = Literal["flat", "ivf", "hnsw"]
Floats = npt.NDArray[np.float32]
Seqs = npt.NDArray[np.int64]
#: What ``export`` holds while it reads an index that others change: the lock they change it
#: under (or a null context where nobody else does).
Hold = AbstractContextManager[object]

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


class Backend(Protocol):
    kind: Kind

    @property
    def index(self) -> faiss.Index: ...
    @property
    def row_seq(self) -> Seqs: ...  # row -> seq, saved with the snapshot; empty for flat

    def __len__(self) -> int: ...
    def __contains__(self, seq: int) -> bool: ...
    def add(self, seqs: Seqs, vecs: Floats) -> None: ...
    def remove(self, seqs: Seqs) -> None: ...
    def search(self, vecs: Floats, k: int, probe_share: float = 0.0) -> tuple[Floats, Seqs]:
        """Best k of each query; an IVF index scans at least ``probe_share`` of its lists."""
        ...

    def export(self, hold: Hold) -> tuple[Seqs, Floats]:
        """The live seqs and their vectors, read holding ``hold``; an IVF index holds it for one
        list at a time, so the index may change between two lists (a seq changed meanwhile may
        be read twice or not at all: the caller replays every change made since it began)."""
        ...

    def needs_rebuild(self) -> bool: ...


class SortedSeqs:
    """A set of seqs kept as a sorted array, with the few added or removed since in two small
    sets: the seqs of an IVF index's copy (``Ivf.copy``), written to a snapshot and dropped. A
    set of a million Python ints takes 60-80 ms to free, all of it holding the GIL (every
    thread of the process stands still); an array is freed at once. ``update`` takes seqs not
    held, ``difference_update`` held ones, as ``SeqKeyed`` calls them."""

    def __init__(self, seqs: Seqs) -> None:
        ordered = np.sort(seqs)  # which lets other threads run (np.unique, 0.6 s at 1M, does not)
        once = np.ones(len(ordered), dtype=bool)  # each seq once: a copy may read one twice
        np.not_equal(ordered[1:], ordered[:-1], out=once[1:])
        self._base: Seqs = ordered[once]
        self._added: set[int] = set()  #: never in the base
        self._removed: set[int] = set()  #: in the base

    def __len__(self) -> int:
        return len(self._base) - len(self._removed) + len(self._added)

    def __contains__(self, seq: int) -> bool:
        if seq in self._added:
            return True
        if seq in self._removed:
            return False
        at = int(np.searchsorted(self._base, seq))
        return at < len(self._base) and int(self._base[at]) == seq

    def update(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            if seq in self._removed:
                self._removed.discard(seq)
            else:
                self._added.add(seq)

    def difference_update(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            if seq in self._added:
                self._added.discard(seq)
            else:
                self._removed.add(seq)


class SeqKeyed:
    """A FAISS index whose ids are the seqs themselves (flat and IVF), with the live seqs kept
    beside it. ``add`` takes new seqs only, ``remove`` present ones."""

    index: faiss.Index
    _seqs: set[int] | SortedSeqs

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

    def search(self, vecs: Floats, k: int, probe_share: float = 0.0) -> tuple[Floats, Seqs]:
        return self.index.search(vecs, k)


class Flat(SeqKeyed):
    """Exact search."""

    index: faiss.IndexIDMap2

    kind: Kind = "flat"

    def __init__(self, index: faiss.IndexIDMap2) -> None:
        self.index = index
        self.row_seq: Seqs = np.empty(0, dtype=np.int64)
        self._seqs: set[int] = set(faiss.vector_to_array(index.id_map).tolist())

    @classmethod
    def empty(cls, dim: int) -> Flat:
        return cls(faiss.IndexIDMap2(faiss.IndexFlatIP(dim)))

    def export(self, hold: Hold) -> tuple[Seqs, Floats]:
        with hold:
            seqs: Seqs = faiss.vector_to_array(self.index.id_map)
            vecs: Floats = self.index.index.reconstruct_n(0, self.index.ntotal)
        return seqs, vecs

    def needs_rebuild(self) -> bool:
        return False


class Ivf(SeqKeyed):
    """Approximate search over inverted lists. ``trained_on`` is the live count the lists were
    trained for."""

    index: faiss.IndexIVFScalarQuantizer
    kind: Kind = "ivf"

    def __init__(
        self,
        index: faiss.IndexIVFScalarQuantizer,
        trained_on: int,
        seqs: SortedSeqs | None = None,
    ) -> None:
        """``seqs``: the seqs ``index`` holds, when the caller has them (else read from it)."""
        self.index = index
        self.trained_on = trained_on
        self.row_seq: Seqs = np.empty(0, dtype=np.int64)
        self._seqs = set(self.codes(vectors=False)[0].tolist()) if seqs is None else seqs
        self._params: dict[int, faiss.SearchParametersIVF] = {}  #: by nprobe, for ``search``

    @classmethod
    def trained(cls, vecs: Floats, nprobe: int) -> Ivf:
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

    def export(self, hold: Hold) -> tuple[Seqs, Floats]:
        seqs, codes = self.codes(hold=hold)
        return seqs, self.decode(codes)

    def copy(self, hold: Hold) -> Ivf:
        """A copy with the same lists (the same quantizer, each list's entries copied as they
        are), read as ``export`` reads: holding ``hold`` for one list at a time, so a seq changed
        meanwhile may be held twice or not at all (the caller replays every change made since
        it began, each removing every copy of its seqs first)."""
        src = self.index
        lists = src.invlists
        assert lists is not None, "an IVF index owns its lists"
        quantizer = faiss.clone_index(src.quantizer)  # trained once, never changed
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, src.d, lists.nlist, src.sq.qtype, src.metric_type, src.by_residual
        )
        index.sq = src.sq  # a copy of the codec, trained as it is
        index.is_trained, index.nprobe = src.is_trained, src.nprobe
        into = index.invlists
        assert into is not None
        seqs: list[Seqs] = [np.empty(0, dtype=np.int64)]
        for i, ids, codes in self._lists(hold, vectors=True):
            assert codes is not None
            into.add_entries(i, len(ids), faiss.swig_ptr(ids), faiss.swig_ptr(codes))
            index.ntotal += len(ids)
            seqs.append(ids)
        return Ivf(index, self.trained_on, SortedSeqs(np.concatenate(seqs)))

    def needs_rebuild(self) -> bool:
        n = len(self)
        return n > IVF_REGROW * self.trained_on or n * IVF_REGROW < self.trained_on

    def search(self, vecs: Floats, k: int, probe_share: float = 0.0) -> tuple[Floats, Seqs]:
        nprobe = max(self.index.nprobe, math.ceil(probe_share * self.index.nlist))
        if nprobe == self.index.nprobe:
            return self.index.search(vecs, k)
        params = self._params.get(nprobe)
        if params is None:  # few values ever: one per list count and share
            params = self._params[nprobe] = faiss.SearchParametersIVF()
            params.nprobe = nprobe
        return self.index.search(vecs, k, params=params)

    def codes(
        self, vectors: bool = True, hold: Hold | None = None
    ) -> tuple[Seqs, npt.NDArray[np.uint8]]:
        """Every stored seq and (unless ``vectors`` is False) its vector's code, copied from the
        inverted lists (a copy of bytes: ``decode`` turns them into vectors); each list copied
        holding ``hold``, which is let go between lists."""
        code_size = self.index.code_size
        seqs: list[Seqs] = [np.empty(0, dtype=np.int64)]
        codes: list[npt.NDArray[np.uint8]] = [np.empty((0, code_size), dtype=np.uint8)]
        for _, ids, raw in self._lists(hold or nullcontext(), vectors):
            seqs.append(ids)
            if raw is not None:
                codes.append(raw)
        return np.concatenate(seqs), np.concatenate(codes)

    def _lists(
        self, hold: Hold, vectors: bool
    ) -> Iterator[tuple[int, Seqs, npt.NDArray[np.uint8] | None]]:
        """Each non-empty inverted list's number, seqs and (with ``vectors``) codes, copied
        holding ``hold``, which is let go between lists."""
        lists = self.index.invlists
        assert lists is not None, "an IVF index owns its lists"
        for i in range(lists.nlist):
            with hold:
                size = lists.list_size(i)
                if not size:
                    continue
                ids = faiss.rev_swig_ptr(lists.get_ids(i), size).copy()
                raw = None
                if vectors:
                    raw = faiss.rev_swig_ptr(lists.get_codes(i), size * lists.code_size)
                    raw = raw.reshape(size, lists.code_size).copy()
            yield i, ids, raw

    def decode(self, codes: npt.NDArray[np.uint8]) -> Floats:
        """The vectors of codes this index's quantizer wrote (float32)."""
        if not len(codes):
            return np.empty((0, self.index.d), dtype=np.float32)
        vecs: Floats = self.index.sq.decode(codes)
        return vecs


class Hnsw:
    """Approximate search; FAISS labels are rows, ``row_seq[row]`` is a seq or -1 (removed)."""

    kind: Kind = "hnsw"

    def __init__(self, index: faiss.IndexHNSWFlat, row_seq: Seqs) -> None:
        self.index = index
        self.row_seq = row_seq
        self._row_of = {seq: row for row, seq in enumerate(row_seq.tolist()) if seq >= 0}
        self._params: faiss.SearchParameters | None = None  # built lazily, reset on change
        self._live_bitmap: npt.NDArray[np.uint8] | None = None  # memory the params point into

    @classmethod
    def empty(cls, dim: int, m: int, ef_construction: int, ef_search: int) -> Hnsw:
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

    def search(self, vecs: Floats, k: int, probe_share: float = 0.0) -> tuple[Floats, Seqs]:
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

    def export(self, hold: Hold) -> tuple[Seqs, Floats]:
        with hold:
            live_rows = np.flatnonzero(self.row_seq >= 0).astype(np.int64)
            vecs: Floats = self.index.reconstruct_batch(live_rows)
            return self.row_seq[live_rows], vecs

    def needs_rebuild(self) -> bool:
        return len(self.row_seq) - len(self) > COMPACT_FRACTION * len(self.row_seq)
