from __future__ import annotations

import gc
import logging
import pathlib
import re
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any
from unittest import mock

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import held_rebuilds
from worker.errors import IndexCorrupt
from worker.index import projection, vector
from worker.index.kinds import SortedSeqs
from worker.index.lexical import LexicalIndex
from worker.index.projection import Projection
from worker.index.vector import FORMAT_VERSION, Ann, VectorIndex

DIM = 16


def unit_vectors(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def seq_array(*values: int) -> npt.NDArray[np.int64]:
    return np.array(values, dtype=np.int64)


def filled(
    n: int, ann_threshold: int = 20_000, ann: Ann = "ivf"
) -> tuple[VectorIndex, npt.NDArray[np.float32]]:
    index = VectorIndex(DIM, ann_threshold=ann_threshold, ann=ann)
    vecs = unit_vectors(n)
    index.add(np.arange(n, dtype=np.int64), vecs)
    return index, vecs


def test_flat_search_returns_each_vector_as_its_own_top_hit() -> None:
    index, vecs = filled(100)

    scores, seqs = index.search(vecs, k=3)

    assert index.kind == "flat"
    assert len(index) == 100
    np.testing.assert_array_equal(seqs[:, 0], np.arange(100))
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    assert (scores[:, 0] >= scores[:, 1]).all()


def test_vectors_are_normalised_so_scores_are_cosine() -> None:
    index = VectorIndex(DIM)
    vec = unit_vectors(1)
    index.add(seq_array(7), 5.0 * vec)

    scores, seqs = index.search(0.5 * vec, k=1)

    assert seqs[0, 0] == 7
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-5)


def test_readding_a_seq_replaces_its_vector() -> None:
    index, vecs = filled(10)
    new = unit_vectors(1, seed=99)

    index.add(seq_array(3), new)
    scores, seqs = index.search(vecs[3:4], k=10)

    assert len(index) == 10
    assert list(seqs[0]).count(3) == 1
    assert scores[0, list(seqs[0]).index(3)] == pytest.approx(float(vecs[3] @ new[0]), abs=1e-5)
    assert index.search(new, k=1)[1][0, 0] == 3


def test_duplicate_seqs_in_one_batch_keep_the_last_vector() -> None:
    index = VectorIndex(DIM)
    vecs = unit_vectors(3)

    index.add(seq_array(1, 2, 1), vecs)

    assert len(index) == 2
    assert index.search(vecs[2:3], k=1)[1][0, 0] == 1
    assert index.search(vecs[0:1], k=2)[0][0, 0] < 0.99


def test_removed_seqs_are_never_returned_and_unknown_ones_are_ignored() -> None:
    index, vecs = filled(20)

    index.remove(seq_array(4, 5, 1000))
    _, seqs = index.search(vecs, k=20)

    assert len(index) == 18
    assert 4 not in index
    assert not np.isin(seqs, [4, 5]).any()
    assert (seqs[:, :18] >= 0).all()
    assert (seqs[:, 18:] == -1).all()


def test_search_pads_with_minus_one_when_fewer_than_k_exist() -> None:
    index, vecs = filled(3)

    scores, seqs = index.search(vecs[:2], k=5)

    assert seqs.shape == scores.shape == (2, 5)
    assert scores.dtype == np.float32
    assert seqs.dtype == np.int64
    assert (seqs[:, 3:] == -1).all()
    assert np.isneginf(scores[:, 3:]).all()
    assert sorted(seqs[0, :3]) == [0, 1, 2]


def test_empty_index_returns_only_padding() -> None:
    _, seqs = VectorIndex(DIM).search(unit_vectors(1), k=2)

    np.testing.assert_array_equal(seqs, [[-1, -1]])


@pytest.mark.parametrize(("ann", "total"), [("ivf", 2_000), ("hnsw", 80)])
def test_index_becomes_approximate_past_the_threshold_and_still_finds_each_vector(
    ann: Ann, total: int
) -> None:
    index, vecs = filled(40, ann_threshold=50, ann=ann)
    kind_before = index.kind

    more = unit_vectors(total - 40, seed=1)
    index.add(np.arange(40, total, dtype=np.int64), more)
    _, seqs = index.search(np.vstack([vecs, more]), k=1)

    assert (kind_before, index.kind) == ("flat", ann)
    assert len(index) == total
    np.testing.assert_array_equal(seqs[:, 0], np.arange(total))


def test_ivf_removes_for_real_and_replaces_a_readded_seq() -> None:
    index, vecs = filled(2_000, ann_threshold=50)
    new = unit_vectors(1, seed=99)

    index.remove(np.arange(0, 600, 2, dtype=np.int64))
    index.add(seq_array(1), new)
    _, seqs = index.search(vecs, k=10)

    assert index.kind == "ivf"
    assert len(index) == 1_700
    assert not np.isin(seqs, np.arange(0, 600, 2)).any()
    assert index.search(new, k=1)[1][0, 0] == 1
    np.testing.assert_array_equal(seqs[600:, 0], np.arange(600, 2_000))


def test_ivf_scores_are_the_cosine_within_float16_error() -> None:
    index, vecs = filled(2_000, ann_threshold=50)
    queries = unit_vectors(50, seed=7)

    scores, seqs = index.search(queries, k=5)
    exact = np.einsum("qd,qkd->qk", queries, vecs[seqs])

    assert index.kind == "ivf"
    np.testing.assert_allclose(scores, exact, atol=2e-3)


def test_ivf_keeps_its_vectors_through_a_retrain_within_float16_error() -> None:
    index, vecs = filled(300, ann_threshold=50)
    more = unit_vectors(1_000, seed=3)

    index.add(np.arange(300, 1_300, dtype=np.int64), more)  # 4x growth: retrained from export
    scores, seqs = index.search(vecs, k=1)

    np.testing.assert_array_equal(seqs[:, 0], np.arange(300))
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=2e-3)


def test_ivf_retrains_as_it_grows_and_goes_flat_when_it_shrinks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    index, _ = filled(100, ann_threshold=50)
    more = unit_vectors(900, seed=2)

    with caplog.at_level(logging.INFO, logger="worker.index.vector"):
        index.add(np.arange(100, 1_000, dtype=np.int64), more)
        grown_to = index.kind
        index.remove(np.arange(960, dtype=np.int64))

    assert "index rebuilt kind=ivf from=ivf n=1000" in caplog.text
    assert "index rebuilt kind=flat from=ivf n=40" in caplog.text
    assert (grown_to, index.kind, len(index)) == ("ivf", "flat", 40)
    np.testing.assert_array_equal(index.search(more[860:], k=1)[1][:, 0], np.arange(960, 1_000))


def test_hnsw_hides_removed_seqs_and_still_returns_k_live_results() -> None:
    index, vecs = filled(200, ann_threshold=50, ann="hnsw")
    removed = np.arange(0, 60, 2, dtype=np.int64)  # 15%: below the compaction point

    index.remove(removed)
    _, seqs = index.search(vecs, k=10)

    assert index.kind == "hnsw"
    assert len(index) == 170
    assert not np.isin(seqs, removed).any()
    assert (seqs >= 0).all()
    np.testing.assert_array_equal(seqs[61:, 0], np.arange(61, 200))


def test_hnsw_replaces_a_readded_seq() -> None:
    index, vecs = filled(100, ann_threshold=50, ann="hnsw")
    new = unit_vectors(1, seed=99)

    index.add(seq_array(3), new)

    assert len(index) == 100
    assert index.search(new, k=1)[1][0, 0] == 3
    assert index.search(vecs[3:4], k=1)[1][0, 0] != 3


def test_hnsw_rebuilds_itself_after_many_removals(caplog: pytest.LogCaptureFixture) -> None:
    index, vecs = filled(200, ann_threshold=50, ann="hnsw")

    with caplog.at_level(logging.INFO, logger="worker.index.vector"):
        index.remove(np.arange(60, dtype=np.int64))
    _, seqs = index.search(vecs[60:], k=5)

    assert "index rebuilt kind=hnsw from=hnsw n=140" in caplog.text
    assert index.kind == "hnsw"
    assert len(index) == 140
    np.testing.assert_array_equal(seqs[:, 0], np.arange(60, 200))
    assert not np.isin(seqs, np.arange(60)).any()


def test_hnsw_compaction_below_the_threshold_goes_back_to_flat() -> None:
    index, vecs = filled(100, ann_threshold=50, ann="hnsw")

    index.remove(np.arange(70, dtype=np.int64))
    _, seqs = index.search(vecs[70:], k=1)

    assert index.kind == "flat"
    assert len(index) == 30
    np.testing.assert_array_equal(seqs[:, 0], np.arange(70, 100))


@pytest.mark.parametrize(
    ("n", "ann", "kind"), [(30, "ivf", "flat"), (120, "hnsw", "hnsw"), (2_000, "ivf", "ivf")]
)
def test_save_then_load_gives_the_same_results(
    tmp_path: pathlib.Path, n: int, ann: Ann, kind: str
) -> None:
    index, vecs = filled(n, ann_threshold=50, ann=ann)
    index.remove(seq_array(1, 2, 3))
    index.ef_search = 40
    index.nprobe = 4
    path = tmp_path / "ns.zqindex"

    index.save(path)
    loaded = VectorIndex.load(path)

    assert loaded.kind == index.kind == kind
    assert len(loaded) == len(index)
    assert 2 not in loaded and 4 in loaded
    assert (loaded.ann_threshold, loaded.ann, loaded.ef_search, loaded.nprobe) == (50, ann, 40, 4)
    for got, want in zip(loaded.search(vecs, k=7), index.search(vecs, k=7), strict=True):
        np.testing.assert_array_equal(got, want)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize(("n", "ann"), [(30, "ivf"), (120, "hnsw"), (2_000, "ivf")])
def test_a_loaded_index_accepts_adds_and_removes(tmp_path: pathlib.Path, n: int, ann: Ann) -> None:
    index, vecs = filled(n, ann_threshold=50, ann=ann)
    index.save(tmp_path / "ns.zqindex")
    loaded = VectorIndex.load(tmp_path / "ns.zqindex")
    new = unit_vectors(1, seed=99)

    loaded.remove(seq_array(4))
    loaded.add(seq_array(5), new)

    assert len(loaded) == n - 1
    assert 4 not in loaded.search(vecs, k=5)[1]
    assert loaded.search(new, k=1)[1][0, 0] == 5


@pytest.mark.parametrize(
    ("n", "ann", "kind"), [(30, "ivf", "flat"), (120, "hnsw", "hnsw"), (2_000, "ivf", "ivf")]
)
def test_a_copy_answers_as_the_index_did_whatever_changes_after_it(
    tmp_path: pathlib.Path, n: int, ann: Ann, kind: str
) -> None:
    index, vecs = filled(n, ann_threshold=50, ann=ann)
    before = index.search(vecs, k=5)
    with index.copying(nullcontext()) as taking:
        taking.read()
        copy = taking.finish()

    index.remove(seq_array(0, 1, 2))
    index.add(seq_array(n + 1), unit_vectors(1, seed=7))
    copy.save(tmp_path / "ns.zqindex")

    assert copy.kind == kind and len(copy) == n and len(index) == n - 2
    for got, want in zip(
        VectorIndex.load(tmp_path / "ns.zqindex").search(vecs, k=5), before, strict=True
    ):
        np.testing.assert_array_equal(got, want)


def test_an_ivf_search_scans_at_least_the_share_of_lists_it_is_given() -> None:
    index, _ = filled(4_000, ann_threshold=50)
    exact, _ = filled(4_000)
    queries = unit_vectors(200, seed=3)
    index.nprobe = 1
    truth = exact.search(queries, 10)[1]

    def recall(share: float) -> float:
        found = index.search(queries, 10, share)[1]
        return sum(len(set(f) & set(t)) for f, t in zip(found, truth, strict=True)) / truth.size

    assert index.kind == "ivf" and recall(0.0) < 0.6  # one list of ~100
    assert recall(0.25) > recall(0.0)
    assert recall(1.0) > 0.99  # every list (float16 codes may swap near ties)
    assert index.nprobe == 1  # the share is the call's, not the index's
    assert recall(0.001) == recall(0.0)  # under one list's share: nprobe


def test_save_replaces_an_existing_snapshot(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ns.zqindex"
    filled(10)[0].save(path)
    index, _ = filled(20)

    index.save(path)

    assert len(VectorIndex.load(path)) == 20


def test_load_of_a_missing_file_raises_index_corrupt(tmp_path: pathlib.Path) -> None:
    with pytest.raises(IndexCorrupt):
        VectorIndex.load(tmp_path / "absent.zqindex")


@pytest.mark.parametrize("garbage", [b"", b"not an index at all" * 50, b"PK\x03\x04junk"])
def test_load_of_garbage_raises_index_corrupt(tmp_path: pathlib.Path, garbage: bytes) -> None:
    path = tmp_path / "ns.zqindex"
    path.write_bytes(garbage)

    with pytest.raises(IndexCorrupt):
        VectorIndex.load(path)


def test_load_of_an_older_snapshot_format_raises_index_corrupt(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ns.zqindex"
    filled(2_000, ann_threshold=50)[0].save(path)
    raw = bytearray(path.read_bytes())
    version = np.int64(FORMAT_VERSION).tobytes()
    at = raw.index(version)  # the header's first field, after the npy preamble
    raw[at : at + 8] = np.int64(FORMAT_VERSION - 1).tobytes()
    path.write_bytes(bytes(raw))

    with pytest.raises(IndexCorrupt):
        VectorIndex.load(path)


@pytest.mark.parametrize(("n", "ann"), [(30, "ivf"), (120, "hnsw"), (2_000, "ivf")])
def test_load_of_a_truncated_snapshot_raises_index_corrupt(
    tmp_path: pathlib.Path, n: int, ann: Ann
) -> None:
    path = tmp_path / "ns.zqindex"
    filled(n, ann_threshold=50, ann=ann)[0].save(path)
    path.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(IndexCorrupt):
        VectorIndex.load(path)


@pytest.mark.parametrize(
    ("seqs", "vecs"),
    [
        (seq_array(1, 2), unit_vectors(3)),
        (seq_array(-1), unit_vectors(1)),
        (seq_array(1), np.ones((1, DIM + 1), dtype=np.float32)),
        (np.zeros((1, 1), dtype=np.int64), unit_vectors(1)),
    ],
)
def test_add_refuses_malformed_input(
    seqs: npt.NDArray[np.int64], vecs: npt.NDArray[np.float32]
) -> None:
    index = VectorIndex(DIM)

    with pytest.raises(ValueError):
        index.add(seqs, vecs)
    assert len(index) == 0


def test_search_refuses_a_non_positive_k() -> None:
    with pytest.raises(ValueError):
        VectorIndex(DIM).search(unit_vectors(1), k=0)


_OPS = st.lists(
    st.tuples(st.booleans(), st.lists(st.integers(0, 40), min_size=1, max_size=25)),
    max_size=25,
)


@pytest.mark.parametrize("ann", ["ivf", "hnsw"])
@settings(max_examples=75, deadline=None)
@given(ops=_OPS)
def test_interleaved_adds_and_removes_match_a_set_model(
    ann: Ann, ops: list[tuple[bool, list[int]]]
) -> None:
    index = VectorIndex(DIM, ann_threshold=12, ann=ann)
    model: set[int] = set()
    for step, (is_add, values) in enumerate(ops):
        seqs = np.array(values, dtype=np.int64)
        if is_add:
            index.add(seqs, unit_vectors(len(seqs), seed=step))
            model.update(values)
        else:
            index.remove(seqs)
            model.difference_update(values)
        assert len(index) == len(model)
        assert {s for s in range(41) if s in index} == model
    _, found = index.search(unit_vectors(4, seed=1000), k=50)
    assert set(found[found >= 0].tolist()) <= model


def test_a_rebuild_begun_apart_takes_the_changes_made_while_it_was_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="worker.index.vector")
    index = VectorIndex(DIM, ann_threshold=40)
    vecs = unit_vectors(400)
    index.add(np.arange(300, dtype=np.int64), vecs[:300], rebuild=False)
    assert (index.kind, index.rebuild_due()) == ("flat", True)

    plan = index.begin_rebuild(nullcontext())
    assert not index.rebuild_due()  # one rebuild at a time
    index.add(np.arange(300, 400, dtype=np.int64), vecs[300:], rebuild=False)
    index.remove(np.arange(0, 50, dtype=np.int64), rebuild=False)
    replaced = unit_vectors(1, seed=42)
    index.add(seq_array(60), replaced, rebuild=False)
    assert index.kind == "flat" and len(index) == 350  # the old index serves meanwhile
    built = plan.build()
    assert plan.replayed == 3  # the changes made so far are in it
    index.remove(np.arange(50, 55, dtype=np.int64), rebuild=False)  # and these come at the end
    index.add(seq_array(0), vecs[:1], rebuild=False)
    index.end_rebuild(built, plan.replayed)

    assert (index.kind, len(index), index.rebuild_due()) == ("ivf", 346, False)
    assert re.search(r"index rebuilt kind=ivf from=flat n=346 in [\d.]+ms", caplog.text)
    live = np.array([s for s in [0, *range(55, 400)] if s != 60], dtype=np.int64)
    np.testing.assert_array_equal(index.search(vecs[live], k=1)[1][:, 0], live)
    assert index.search(replaced, k=1)[1][0, 0] == 60
    gone = np.arange(1, 55)
    assert not np.isin(index.search(vecs[gone], k=5)[1], gone).any()


def test_a_failed_rebuild_keeps_the_index_with_its_changes_and_can_be_begun_again() -> None:
    index = VectorIndex(DIM, ann_threshold=40)
    vecs = unit_vectors(120)
    index.add(np.arange(100, dtype=np.int64), vecs[:100], rebuild=False)
    index.begin_rebuild(nullcontext())
    index.add(np.arange(100, 120, dtype=np.int64), vecs[100:], rebuild=False)
    index.end_rebuild(None)

    assert (index.kind, len(index), index.rebuild_due()) == ("flat", 120, True)
    plan = index.begin_rebuild(nullcontext())
    index.end_rebuild(plan.build(), plan.replayed)
    assert index.kind == "ivf"
    np.testing.assert_array_equal(index.search(vecs, k=1)[1][:, 0], np.arange(120))


def test_a_deferred_rebuild_is_done_at_once_past_regrow_times_the_size_it_was_due_at() -> None:
    index = VectorIndex(DIM, ann_threshold=40)
    vecs = unit_vectors(200)
    kinds = []
    for seq in range(200):
        index.add(seq_array(seq), vecs[seq : seq + 1], rebuild=False)
        kinds.append(index.kind)
    assert kinds.index("ivf") == 4 * 41 - 1  # due at 41 live vectors, done at 164


def test_searches_take_the_projection_while_its_index_is_rebuilt() -> None:
    proj = Projection("ns", VectorIndex(DIM, ann_threshold=40), LexicalIndex())
    vecs = unit_vectors(160)

    def add(seqs: range) -> None:
        proj.add(
            list(seqs),
            [f"n{s}" for s in seqs],
            vecs[seqs.start : seqs.stop],
            [()] * len(seqs),
            [["word"]] * len(seqs),
        )

    add(range(100))
    assert proj.index.kind == "flat"
    with held_rebuilds(10) as held:
        proj.settle_soon()
        assert held.building.wait(10)
        assert proj.lock.acquire(timeout=5)  # not held while the new index is built
        try:
            assert proj.index.search(vecs[:1], k=1)[1][0, 0] == 0
            add(range(100, 160))
        finally:
            proj.lock.release()
        held.go_on.set()
        assert proj.wait_settled(10)

    assert (proj.index.kind, len(proj.index)) == ("ivf", 160)
    np.testing.assert_array_equal(proj.index.search(vecs, k=1)[1][:, 0], np.arange(160))
    proj.settle()  # nothing due: returns at once
    assert proj.index.kind == "ivf"


def test_a_projection_keeps_keywords_the_garbage_collector_need_not_walk() -> None:
    proj = Projection("ns", VectorIndex(DIM), LexicalIndex())
    kws = [[f"k{s}", "shared"] for s in range(50)]
    proj.add(list(range(50)), [f"n{s}" for s in range(50)], unit_vectors(50), kws, [[]] * 50)
    gc.collect()  # a tuple of strings is untracked once a collection has seen it
    assert proj.keywords[7] == ("k7", "shared")
    assert not any(gc.is_tracked(k) for k in proj.keywords.values())


def test_one_rebuild_runs_at_a_time_and_wait_settled_waits_for_it() -> None:
    proj = Projection("ns", VectorIndex(DIM, ann_threshold=40), LexicalIndex())
    vecs = unit_vectors(100)
    proj.add(list(range(100)), [f"n{s}" for s in range(100)], vecs, [()] * 100, [[]] * 100)
    with held_rebuilds(10) as held:
        proj.settle_soon()
        proj.settle_soon()  # one is running: no second
        assert not proj.wait_settled(0.2) and proj.rebuilding()
        held.go_on.set()
        assert proj.wait_settled(10) and not proj.rebuilding()
    assert len(held.plans) == 1 and proj.index.kind == "ivf"
    assert proj.wait_settled(0)  # none started since: returns at once


class Meddling:
    """A hold that lets ``changes`` run, one each time it is let go: as the owner's changes
    would between two IVF lists read apart."""

    def __init__(self, changes: Iterator[Any]) -> None:
        self.changes, self.entered = changes, 0

    def __enter__(self) -> Meddling:
        self.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        change = next(self.changes, None)
        if change is not None:
            change()


def test_an_ivf_retrain_reads_its_lists_apart_and_takes_the_changes_made_between_them() -> None:
    index = VectorIndex(DIM, ann_threshold=40)
    vecs = unit_vectors(1_600)
    index.add(np.arange(300, dtype=np.int64), vecs[:300])
    index.add(np.arange(300, 1_300, dtype=np.int64), vecs[300:1_300], rebuild=False)
    assert (index.kind, index.rebuild_due()) == ("ivf", True)
    change, now = meddled(index, vecs, 1_300)

    hold = Meddling(change(i) for i in range(300))
    plan = index.begin_rebuild(hold)
    built = plan.build()
    assert plan.replayed > 0
    for i in range(300, 330):  # changes after the build
        change(i)()
    index.end_rebuild(built, plan.replayed)

    assert hold.entered > 1  # one list at a time
    assert (index.kind, index.rebuild_due()) == ("ivf", False)
    holds_exactly(index, now, vecs, 1_300)


def meddled(index: VectorIndex, vecs: npt.NDArray[np.float32], n: int) -> Any:
    """``change(i)``: a change to ``index`` as ingest would make it (a note's new vector, a
    removal, a note back); ``now`` maps each live seq to the row of ``vecs`` it holds."""
    now = {seq: seq for seq in range(n)}
    moves = iter(range(n, len(vecs)))

    def change(i: int) -> Any:
        def run() -> None:
            seq = (i * 97) % n
            if i % 3 == 0:  # a new vector for a note: it moves to another list
                row = next(moves)
                index.add(seq_array(seq), vecs[row : row + 1], rebuild=False)
                now[seq] = row
            elif i % 3 == 1:
                index.remove(seq_array(seq), rebuild=False)
                now.pop(seq, None)
            else:  # a note that comes back, or a new one
                index.add(seq_array(seq), vecs[seq : seq + 1], rebuild=False)
                now[seq] = seq

        return run

    return change, now


def holds_exactly(
    index: VectorIndex, now: dict[int, int], vecs: npt.NDArray[np.float32], n: int
) -> None:
    assert len(index) == len(now) and all(seq in index for seq in now)
    assert not any(seq in index for seq in range(n) if seq not in now)
    index.nprobe = 1_000  # every list: the nearest is the note itself, found once
    live = np.array(sorted(now), dtype=np.int64)
    seqs = index.search(vecs[[now[s] for s in live.tolist()]], k=2)[1]
    np.testing.assert_array_equal(seqs[:, 0], live)
    assert (seqs[:, 1] != live).all()  # no seq held twice


def test_an_ivf_copy_reads_its_lists_apart_and_takes_the_changes_made_meanwhile() -> None:
    index = VectorIndex(DIM, ann_threshold=40)
    vecs = unit_vectors(1_600)
    index.add(np.arange(1_300, dtype=np.int64), vecs[:1_300])
    assert index.kind == "ivf"
    change, now = meddled(index, vecs, 1_300)
    hold = Meddling(change(i) for i in range(300))
    with index.copying(hold) as taking:
        for i in range(300, 310):  # before the lists are read: in the copy and kept too
            change(i)()
        taking.read()
        for i in range(310, 330):  # after: kept
            change(i)()
        copy = taking.finish()
        seen = dict(now)
    assert hold.entered > 10  # one list at a time
    for i in range(330, 360):  # after it finished: not in the copy
        change(i)()

    assert copy.kind == "ivf" and not index._copies
    holds_exactly(copy, seen, vecs, 1_300)
    holds_exactly(index, now, vecs, 1_300)


def test_an_ivf_copy_with_no_change_has_the_same_lists() -> None:
    index, vecs = filled(2_000, ann_threshold=50)
    with index.copying(nullcontext()) as taking:
        taking.read()
        copy = taking.finish()
    for got, want in zip(copy.search(vecs, k=10), index.search(vecs, k=10), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("n", "ann"), [(30, "ivf"), (120, "hnsw")])
def test_a_flat_or_hnsw_copy_is_taken_whole_and_takes_the_changes_made_after(
    n: int, ann: Ann
) -> None:
    index = VectorIndex(DIM, ann_threshold=50, ann=ann)
    vecs = unit_vectors(n + 40)
    index.add(np.arange(n, dtype=np.int64), vecs[:n])
    change, now = meddled(index, vecs, n)
    with index.copying(Meddling(iter(()))) as taking:
        for i in range(30):
            change(i)()
        taking.read()
        copy = taking.finish()
    assert copy.kind == index.kind
    assert len(copy) == len(now) and all(seq in copy for seq in now)
    live = np.array(sorted(now), dtype=np.int64)
    np.testing.assert_array_equal(
        copy.search(vecs[[now[s] for s in live.tolist()]], k=1)[1][:, 0], live
    )


def test_a_copy_given_up_keeps_no_changes() -> None:
    index, _ = filled(2_000, ann_threshold=50)
    with pytest.raises(RuntimeError), index.copying(nullcontext()):
        raise RuntimeError("disk full")
    assert not index._copies


def test_a_projections_maps_are_copied_apart_with_the_changes_made_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(projection, "MAPS_CHUNK", 7)
    proj = Projection("ns", VectorIndex(DIM), LexicalIndex())
    vecs = unit_vectors(100)
    proj.add(list(range(100)), [f"n{s}" for s in range(100)], vecs, [["k"]] * 100, [["t"]] * 100)

    def change(i: int) -> Any:
        def run() -> None:
            seq = (i * 37) % 120
            if i % 3 == 1:
                proj.remove([seq])
            else:  # a note updated, or a new one
                proj.add([seq], [f"v{i}"], vecs[:1], [[f"k{i}"]], [[f"t{i}", "t"]])

        return run

    proj.lock = Meddling(change(i) for i in range(40))  # type: ignore[assignment]
    with proj.copying_maps() as maps:
        maps.read()
        assert all(len(part) <= 7 for part in maps.parts[0])  # no large dict grown under the lock
        for i in range(40, 50):  # after the read: kept for finish
            change(i)()
        ids, keywords, terms = maps.finish()
        assert (ids, keywords, terms) == (proj.ids, proj.keywords, proj.lexical.docs)
    assert proj.lock.entered > 10  # type: ignore[attr-defined]
    assert any(nid.startswith("v") for nid in ids.values()) and len(ids) != 100
    change(50)()  # after it finished: not in the copy
    assert ids != proj.ids and not proj._changed


def test_namespaces_due_together_rebuild_one_at_a_time() -> None:
    projs = [
        Projection(f"ns{i}", VectorIndex(DIM, ann_threshold=40), LexicalIndex()) for i in range(3)
    ]
    vecs = unit_vectors(100)
    for proj in projs:
        proj.add(list(range(100)), [f"n{s}" for s in range(100)], vecs, [()] * 100, [[]] * 100)
    building, most = [0], [0]
    build = vector.Rebuild.build

    def counted_build(plan: vector.Rebuild) -> Any:
        building[0] += 1
        most[0] = max(most[0], building[0])
        time.sleep(0.05)
        try:
            return build(plan)
        finally:
            building[0] -= 1

    with mock.patch.object(vector.Rebuild, "build", counted_build):
        for proj in projs:
            proj.settle_soon()
        assert all(proj.wait_settled(10) for proj in projs)
    assert most[0] == 1
    assert [proj.index.kind for proj in projs] == ["ivf"] * 3


@settings(max_examples=200, deadline=None)
@given(
    st.sets(st.integers(0, 60)),
    st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=80),
)
def test_sorted_seqs_hold_what_a_set_would(
    start: set[int], changes: list[tuple[bool, int]]
) -> None:
    """An IVF copy's seqs (``SortedSeqs``, an array with the changes beside it) against a set,
    through adds of seqs not held and removes of held ones (what ``SeqKeyed`` makes), the first
    array with every seq twice (a copy may read a seq that moved between two lists twice)."""
    held = SortedSeqs(np.array(sorted(start) * 2, dtype=np.int64))
    model = set(start)
    for add, seq in changes:
        if add and seq not in model:
            held.update([seq])
            model.add(seq)
        elif not add and seq in model:
            held.difference_update([seq])
            model.discard(seq)
        assert len(held) == len(model)
    assert [s for s in range(-1, 62) if s in held] == sorted(model)
