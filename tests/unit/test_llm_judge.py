"""The LLM judge's pure parts: what is queued for a note, and what a verdict does to its
links."""

from __future__ import annotations

from pathlib import Path

import msgpack

from worker.organise.judge import Judged, Request, plan_links, request
from worker.organise.linking import Candidate
from worker.settings import WorkerSettings
from worker.store.notes import Link

MODEL = "model:m"


def settings(**overrides: object) -> WorkerSettings:
    values: dict[str, object] = {
        "llm_url": "http://127.0.0.1:9/v1",
        "judge": "llm",
        "link_k": 3,
        "judge_min_similarity": 0.1,
        "index_dir": Path("unused"),
    }
    values.update(overrides)
    return WorkerSettings(**values)  # type: ignore[arg-type]


def test_request_keeps_the_best_candidates_over_the_prefilter_once_each() -> None:
    cands = [
        Candidate("a", 0.2, frozenset()),
        Candidate("b", 0.05, frozenset()),  # obviously unrelated: never shown
        Candidate("a", 0.4, frozenset()),  # the same note found twice
        Candidate("new", 0.9, frozenset()),  # itself
        Candidate("c", 0.3, frozenset()),
        Candidate("d", 0.15, frozenset()),
        Candidate("e", 0.12, frozenset()),
    ]

    (packed,) = request("new", "1-0", cands, settings())

    entry = msgpack.unpackb(packed)
    assert entry.pop("at") > 0  # when it was queued
    assert entry == {"id": "new", "src": "1-0", "c": [["a", 0.4], ["c", 0.3], ["d", 0.15]]}


def test_request_queues_nothing_without_candidates_or_an_llm() -> None:
    weak = [Candidate("a", 0.05, frozenset())]
    strong = [Candidate("a", 0.5, frozenset())]

    assert request("new", "1-0", weak, settings()) == []
    assert request("new", "1-0", strong, settings(llm_url=None)) == []


REQ = Request("n", "1-0", (("a", 0.5), ("b", 0.3), ("c", 0.2), ("d", 0.12)))
RULE = {"source": "rule:similarity", "reason": "cosine 0.50; shared x", "label": "related"}


def test_a_verdict_links_the_picks_with_their_relation_and_drops_rejected_rule_links() -> None:
    existing = {"a": (0.5, RULE), "b": (0.3, RULE), "z": (0.4, RULE)}
    judged = Judged(REQ, {"b": "supports", "d": "example_of"})

    adds, removes = plan_links(judged, {"a", "b", "c", "d"}, existing, 0.15, 8, MODEL)

    assert adds == [
        Link("n", "b", 0.3, "judged supports; cosine 0.30", "supports", MODEL),
        Link("n", "d", 0.15, "judged example_of; cosine 0.12", "example_of", MODEL),
    ]
    # b is rewritten, a (shown, rejected) removed; z was not shown, so it stays
    assert sorted(removes) == [("n", "a"), ("n", "b")]


def test_a_verdict_keeps_sequence_links_and_links_of_other_stages() -> None:
    sequence = {"source": "rule:sequence", "reason": "sequence", "label": "sequence"}
    insight = {"source": "consolidation", "reason": "abstracted_from"}
    existing = {"a": (1.0, sequence), "b": (0.5, insight), "c": (1.0, sequence)}
    judged = Judged(REQ, {"c": "updates"})

    adds, removes = plan_links(judged, {"a", "b", "c", "d"}, existing, 0.15, 8, MODEL)

    assert adds == [Link("n", "c", 1.0, "sequence; judged updates; cosine 0.20", "updates", MODEL)]
    assert removes == [("n", "c")]


def test_a_verdict_skips_notes_gone_meanwhile_and_keeps_at_most_max_links() -> None:
    judged = Judged(REQ, {"a": "related", "b": "related", "c": "related"})

    adds, _ = plan_links(judged, {"b", "c"}, {}, 0.15, 1, MODEL)

    assert [link.b for link in adds] == ["b"]
