"""Evolution policy (pure): which tags spread to a neighbour, bounded; which audit entries are
triggers and where the next run starts; the model's answer schema; the review call's shape."""

from __future__ import annotations

import msgpack
import pytest
from pydantic import ValidationError
from redis.exceptions import ResponseError

from producer import Conflict, InvalidInput, NotFound
from producer import proposals as rv
from producer.keys import Keys
from worker.organise.evolution import (
    MAX_NEW_TAGS,
    EvolutionAnswer,
    added_tags,
    consensus_tags,
    rare_shared,
    read_triggers,
    rule_change,
)


def test_rare_shared_keywords_not_yet_tags_spread_rarest_first():
    rarity = {"snowflake": 0.4, "warehouse": 2.5, "credits": 3.1, "idle": 4.0}

    picked = rare_shared(
        ["snowflake", "warehouse", "credits", "idle"],
        ["snowflake", "warehouse", "credits", "monday"],
        ["warehouse"],
        rarity,
        min_idf=2.0,
    )

    assert picked == ["credits"]  # idle is not shared, warehouse is a tag, snowflake is common


def test_a_tag_spreads_only_with_a_quorum_and_enough_support():
    assert consensus_tags([], [["billing"], ["billing"], ["ops"]]) == [("billing", 2)]
    assert consensus_tags([], [["billing"], ["ops"], ["ops"], ["x"]]) == []  # 2 of 4 < 2/3
    assert consensus_tags([], [["billing"]]) == []  # one neighbour is no consensus
    assert consensus_tags(["billing"], [["billing"], ["billing"]]) == []  # already carried
    assert consensus_tags([], [["a", "a"], ["a"]]) == [("a", 2)]  # a note votes once


def test_added_tags_are_bounded_per_proposal_and_by_the_tag_cap():
    assert added_tags(["a"], ["b", "a", "c", "d", "e"], MAX_NEW_TAGS, 32) == ["b", "c", "d"]
    assert added_tags(["a", "b"], ["c", "d"], MAX_NEW_TAGS, 3) == ["c"]
    assert added_tags(["a", "b"], ["c"], MAX_NEW_TAGS, 2) == []


def test_the_rule_states_a_reason_per_tag_and_proposes_nothing_without_one():
    change = rule_change(["x"], ["credits"], [("billing", 3)], 4, 32)

    assert change == (
        ["x", "credits", "billing"],
        "shared rare keyword credits; billing on 3 of 4 neighbours",
    )
    assert rule_change(["x"], [], [], 0, 32) is None


def entry(op: str, nid: str, links: dict[str, object] | None, source: str = "inbox:1-0"):
    return {
        b"op": op.encode(),
        b"id": nid.encode(),
        b"source": source.encode(),
        b"after": msgpack.packb({"links": links} if links is not None else None),
    }


def test_triggers_are_creates_and_updates_that_made_links_and_the_cursor_stops_at_the_limit():
    entries = [
        (b"1-0", entry("create", "a", {})),
        (b"2-0", entry("create", "b", {"a": [0.4, "cosine 0.40"]})),
        (b"3-0", entry("evolve", "a", None)),
        (b"4-0", entry("update", "b", {"a": [0.4, "cosine 0.40"]}, "inbox:4-0")),
        (b"5-0", entry("create", "c", {"b": [0.3, "cosine 0.30"]})),
        (b"6-0", entry("delete", "a", None)),
    ]

    assert read_triggers(entries) == ({"b": ["inbox:1-0", "inbox:4-0"], "c": ["inbox:1-0"]}, b"6-0")
    assert read_triggers(entries, limit=1) == ({"b": ["inbox:1-0", "inbox:4-0"]}, b"4-0")
    assert read_triggers([]) == ({}, None)


def test_the_model_answer_names_shown_notes_once_with_bounded_changes():
    shown = {"shown": frozenset({1, 2})}

    ok = EvolutionAnswer.model_validate(
        {"changes": [{"note": 2, "add_tags": [" cost "], "context": "c"}]}, context=shown
    )

    assert ok.changes[0].add_tags == ["cost"]
    bad = [
        {"changes": [{"note": 3}]},
        {"changes": [{"note": 1}, {"note": 1}]},
        {"changes": [{"note": 1, "add_tags": ["a", "b", "c", "d"]}]},
        {"changes": [{"note": 1, "add_tags": [""]}]},
        {"changes": [{"note": 1, "context": "x" * 301}]},
    ]
    for answer in bad:
        with pytest.raises(ValidationError):
            EvolutionAnswer.model_validate(answer, context=shown)


def proposal_hash(status: str = "applied") -> dict[bytes, bytes]:
    return {
        b"id": b"p1",
        b"note": b"n1",
        b"status": status.encode(),
        b"source": b"rule",
        b"reason": b"billing on 2 of 2 neighbours",
        b"fields": b"tags",
        b"triggers": msgpack.packb(["t1"]),
        b"batch": msgpack.packb(["inbox:1-0"]),
        b"created_at": b"10.5",
        b"updated_at": b"11.5",
        b"b:tags": msgpack.packb(["a"]),
        b"a:tags": msgpack.packb(["a", "billing"]),
        b"b:version": b"3",
        b"a:version": b"4",
        b"b:updated_at": b"9.0",
        b"a:updated_at": b"11.5",
    }


def test_a_proposal_hash_decodes_and_a_revert_call_targets_its_keys():
    keys = Keys("zq", 8)
    p = rv.parse_proposal("ns", proposal_hash())
    assert (p.note, p.status, p.before, p.after) == (
        "n1",
        "applied",
        {"tags": ["a"]},
        {"tags": ["a", "billing"]},
    )

    script_keys, args = rv.review_call(keys, "ns", "revert", proposal_hash(), "me", 12.0)

    assert script_keys == [
        keys.lock("ns"),
        keys.proposal("ns", "p1"),
        keys.note("ns", "n1"),
        keys.audit("ns"),
        keys.proposed("ns"),
        keys.proposals("ns", "applied"),
        keys.proposals("ns", "reverted"),
        keys.refused("ns"),
        keys.version("ns"),
    ]
    assert args[:7] == ["revert", "n1", "12.0", "me", "applied", "reverted", "evolve-revert"]
    assert msgpack.unpackb(args[7]) == {"tags": ["a", "billing"], "version": 4}
    assert msgpack.unpackb(args[8]) == {"tags": ["a"], "version": 3}


def test_listing_merges_statuses_newest_first_and_checks_its_input():
    rows = [[(b"p3", 3.0), (b"p1", 1.0)], [(b"p2", 2.0)]]
    assert rv.newest(rows, 2) == ["p3", "p2"]
    assert rv.statuses(None) == rv.STATUSES and rv.statuses("pending") == ("pending",)
    with pytest.raises(InvalidInput):
        rv.statuses("maybe")


def test_script_errors_map_to_typed_errors_and_a_locked_namespace_is_retried():
    with pytest.raises(Conflict):
        rv.raise_review_error(ResponseError("CONFLICT the note changed since (tags)"))
    with pytest.raises(NotFound):
        rv.raise_review_error(ResponseError("NOTFOUND no such proposal"))
    with pytest.raises(ResponseError):
        rv.raise_review_error(ResponseError("ERR something else"))
    assert rv.raise_review_error(ResponseError("LOCKED a worker holds the lock")) is None
