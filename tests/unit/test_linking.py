from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from worker.organise.linking import (
    STRONG_MARGIN,
    Candidate,
    Step,
    batch_candidates,
    dedupe_links,
    judge,
    sequence_links,
)
from worker.store.degree import cap_degree
from worker.store.notes import Link

THRESHOLD = 0.3
KW = frozenset({"orders", "shipping"})


def cand(note_id: str, similarity: float, *keywords: str) -> Candidate:
    """An indexed note as a candidate: its keywords a tuple, as the projection keeps them."""
    return Candidate(note_id, similarity, keywords)


def linked(links: list[Link]) -> list[str]:
    return [link.b for link in links]


def test_judge_links_a_candidate_over_the_threshold_sharing_a_keyword() -> None:
    links = judge("new", KW, [cand("c1", 0.35, "orders", "refunds")], THRESHOLD, 8)

    assert links == [Link("new", "c1", 0.35, "cosine 0.35; shared orders")]


def test_judge_skips_a_candidate_below_the_threshold_even_with_shared_keywords() -> None:
    assert judge("new", KW, [cand("c1", 0.29, "orders", "shipping")], THRESHOLD, 8) == []


def test_judge_links_a_candidate_exactly_at_the_threshold() -> None:
    assert linked(judge("new", KW, [cand("c1", THRESHOLD, "orders")], THRESHOLD, 8)) == ["c1"]


def test_judge_needs_a_shared_keyword_unless_the_cosine_is_strong() -> None:
    weak = THRESHOLD + STRONG_MARGIN - 0.01
    strong = THRESHOLD + STRONG_MARGIN

    assert judge("new", KW, [cand("c1", weak, "weather")], THRESHOLD, 8) == []
    assert judge("new", KW, [cand("c2", strong, "weather")], THRESHOLD, 8) == [
        Link("new", "c2", round(strong, 4), f"cosine {strong:.2f}")
    ]


def test_judge_names_at_most_five_shared_keywords_sorted() -> None:
    words = ("f", "e", "d", "c", "b", "a", "g")

    (link,) = judge("new", frozenset(words), [cand("c1", 0.5, *words)], THRESHOLD, 8)

    assert link.reason == "cosine 0.50; shared a, b, c, d, e"


def test_judge_caps_at_max_links_keeping_the_strongest_first() -> None:
    cands = [cand(f"c{i}", 0.3 + i / 100, "orders") for i in range(10)]

    links = judge("new", KW, cands, THRESHOLD, 3)

    assert linked(links) == ["c9", "c8", "c7"]
    assert [link.weight for link in links] == [0.39, 0.38, 0.37]


def test_judge_with_max_links_zero_links_nothing() -> None:
    assert judge("new", KW, [cand("c1", 0.9, "orders")], THRESHOLD, 0) == []


def test_judge_ignores_the_note_itself() -> None:
    links = judge("new", KW, [cand("new", 1.0, "orders"), cand("c1", 0.5, "orders")], 0.3, 8)

    assert linked(links) == ["c1"]


def test_judge_links_each_candidate_once() -> None:
    links = judge("new", KW, [cand("c1", 0.5, "orders"), cand("c1", 0.4, "orders")], 0.3, 8)

    assert links == [Link("new", "c1", 0.5, "cosine 0.50; shared orders")]


def test_judge_rounds_the_weight() -> None:
    (link,) = judge("new", KW, [cand("c1", 0.123456789, "orders")], 0.1, 8)

    assert link.weight == 0.1235


def test_judge_skips_rejected_candidates_without_using_up_the_cap() -> None:
    cands = [cand("strong-but-off-topic", 0.4, "weather"), cand("c1", 0.35, "orders")]

    assert linked(judge("new", KW, cands, THRESHOLD, 1)) == ["c1"]


def unit(*rows: list[float]) -> npt.NDArray[np.float32]:
    x = np.array(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_batch_candidates_only_proposes_earlier_notes() -> None:
    vecs = unit([1, 0, 0], [1, 0.1, 0], [0.9, 0.2, 0.1], [1, 0, 0.05])
    kws = [frozenset({f"k{i}"}) for i in range(4)]

    out = batch_candidates(["a", "b", "c", "d"], vecs, kws, k=10)

    assert out[0] == []
    assert [c.note_id for c in out[1]] == ["a"]
    assert {c.note_id for c in out[2]} == {"a", "b"}
    assert {c.note_id for c in out[3]} == {"a", "b", "c"}
    assert out[1][0].keywords == frozenset({"k0"})


def test_batch_candidates_score_cosines_of_rows_off_unit_length_as_the_index_does() -> None:
    vecs = unit([1, 0], [0.6, 0.8]) * np.array([[1.0], [0.999]], dtype=np.float32)
    kws = [frozenset(), frozenset()]

    out = batch_candidates(["a", "b"], vecs, kws, k=10)

    assert out[1][0].similarity == pytest.approx(0.6, abs=1e-6)


def test_batch_candidates_ranks_by_cosine_and_keeps_k() -> None:
    vecs = unit([1, 0], [0, 1], [0.6, 0.8], [0.8, 0.6])

    out = batch_candidates(["a", "b", "c", "d"], vecs, [frozenset()] * 4, k=2)

    # d . c = 0.96, d . a = 0.8, d . b = 0.6: the two best, strongest first
    assert [c.note_id for c in out[3]] == ["c", "a"]
    assert [c.similarity for c in out[3]] == pytest.approx([0.96, 0.8])


def test_batch_candidates_break_ties_on_the_earlier_note() -> None:
    vecs = unit([1, 0], [0, 1], [1, 0], [0, 1], [1, 0])

    out = batch_candidates(["a", "b", "c", "d", "e"], vecs, [frozenset()] * 5, k=2)

    assert [c.note_id for c in out[4]] == ["a", "c"]
    assert [c.note_id for c in out[3]] == ["b", "a"]


@pytest.mark.parametrize(("n", "k"), [(0, 5), (1, 5), (3, 0)])
def test_batch_candidates_of_tiny_batches_or_k_zero_is_empty(n: int, k: int) -> None:
    vecs = unit(*[[1.0, float(i)] for i in range(n)]) if n else np.zeros((0, 2), np.float32)

    out = batch_candidates([f"n{i}" for i in range(n)], vecs, [frozenset()] * n, k=k)

    assert out == [[] for _ in range(n)]


def test_dedupe_links_keeps_one_link_per_pair_the_strongest_weight_with_every_reason() -> None:
    links = [
        Link("a", "b", 0.4, "r1"),
        Link("b", "a", 0.6, "r2"),
        Link("a", "c", 0.5, "r3"),
        Link("a", "b", 0.5, "r4"),
    ]

    out = dedupe_links(links)

    assert sorted(out, key=lambda link: link.reason) == [
        Link("b", "a", 0.6, "r2; r1; r4"),
        Link("a", "c", 0.5, "r3"),
    ]


def test_dedupe_links_keeps_the_first_of_equal_weights_and_both_reasons() -> None:
    out = dedupe_links([Link("a", "b", 0.5, "first"), Link("b", "a", 0.5, "second")])

    assert out == [Link("a", "b", 0.5, "first; second")]


def test_dedupe_links_of_nothing_is_nothing() -> None:
    assert dedupe_links([]) == []


def test_judge_ignores_shared_keywords_that_are_too_common() -> None:
    rarity = {"caroline": 0.7, "sweden": 4.0}.get
    common = [cand("c1", 0.3, "caroline")]
    rare = [cand("c2", 0.3, "sweden")]

    def weigh(kw: str) -> float:
        return rarity(kw) or 0.0

    assert judge("new", frozenset({"caroline"}), common, THRESHOLD, 8, weigh, 2.0) == []
    (link,) = judge("new", frozenset({"sweden"}), rare, THRESHOLD, 8, weigh, 2.0)
    assert link.reason.endswith("shared sweden")


def step(note_id: str, event_time: float | None = None, agent: str | None = "a", at: float = 0.0):
    return Step(note_id, event_time, agent, at)


def test_sequence_links_consecutive_notes_of_one_episode() -> None:
    steps = [step("n1", 1.0), step("n2", 1.0), step("n3", 2.0), step("n4", 2.0)]
    links = sequence_links(step("n0", 1.0), steps, window_s=60, weight=0.8)
    assert [(lk.a, lk.b) for lk in links] == [("n1", "n0"), ("n2", "n1"), ("n4", "n3")]
    assert all(lk.weight == 0.8 and lk.reason == "sequence" for lk in links)
    assert sequence_links(None, steps, 60, weight=0.0) == []


def test_without_event_time_an_episode_is_one_agent_within_the_window() -> None:
    steps = [
        step("n1", at=0),
        step("n2", at=30),
        step("n3", agent="b", at=31),
        step("n4", agent="b", at=500),
    ]
    links = sequence_links(None, steps, window_s=60, weight=1.0)
    assert [(lk.a, lk.b) for lk in links] == [("n2", "n1")]


def test_cap_degree_keeps_new_links_while_no_note_is_over_the_cap() -> None:
    new = [Link("n", "a", 0.3, "r"), Link("n", "b", 0.4, "r")]

    assert cap_degree({"a": {"x": 0.9}}, new, 2) == (new, [])


def test_cap_degree_drops_the_weakest_existing_link_of_a_full_neighbour() -> None:
    existing = {"hub": {"x": 0.9, "y": 0.2}, "n": {}}

    kept, dropped = cap_degree(existing, [Link("n", "hub", 0.5, "r")], 2)

    assert kept == [Link("n", "hub", 0.5, "r")]
    assert dropped == [("hub", "y", 0.2)]


def test_cap_degree_refuses_a_new_link_weaker_than_everything_the_hub_has() -> None:
    existing = {"hub": {"x": 0.9, "y": 0.8}}

    kept, dropped = cap_degree(existing, [Link("n", "hub", 0.1, "r")], 2)

    assert kept == [] and dropped == []


def test_cap_degree_caps_the_new_note_itself_and_zero_means_no_cap() -> None:
    new = [Link("n", f"c{i}", 0.1 * i, "r") for i in range(1, 6)]

    kept, _ = cap_degree({}, new, 3)
    assert [link.b for link in kept] == ["c3", "c4", "c5"]
    assert cap_degree({}, new, 0) == (new, [])


def test_cap_degree_breaks_ties_on_the_smaller_neighbour_id() -> None:
    existing = {"hub": {"b": 0.5, "a": 0.5}}

    _, dropped = cap_degree(existing, [Link("hub", "c", 0.9, "r")], 2)

    assert dropped == [("a", "hub", 0.5)]


def test_sequence_and_similarity_links_carry_their_label_and_rule() -> None:
    steps = [Step("s1", 1.0, None, 0.0), Step("s2", 1.0, None, 1.0)]
    (seq,) = sequence_links(None, steps, 600.0, 1.0)
    (sim,) = judge("new", KW, [cand("c1", 0.35, "orders")], THRESHOLD, 8)

    assert (seq.label, seq.source) == ("sequence", "rule:sequence")
    assert (sim.label, sim.source) == ("related", "")  # the writer's default: rule:similarity
    merged = dedupe_links([Link("s2", "s1", 0.3, "cosine 0.30"), seq])
    assert [(m.label, m.source, m.reason) for m in merged] == [
        ("sequence", "rule:sequence", "sequence; cosine 0.30")
    ]
