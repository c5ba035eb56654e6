"""The near-duplicate rule (pure): same words, same numbers, same negations, same event,
high cosine; and which of the two survives."""

from __future__ import annotations

import pytest

from worker.organise.merge import (
    MergePlan,
    adopt,
    find_duplicates,
    is_duplicate,
    overlap,
    settled_up_to,
    survivor,
)
from worker.organise.pairs import Text


def note(nid: str, content: str, **kw) -> Text:
    values = {
        "kind": "note",
        "at": 1.0,
        "active": True,
        "valid_to": None,
        "superseded_by": None,
        "access_count": 0,
        "created_at": 1.0,
        "event_time": None,
    }
    values.update(kw)
    return Text(id=nid, content=content, **values)


FACT = "The customer's Snowflake account uses key-pair auth with Azure AD"


def test_rewordings_of_the_same_words_are_duplicates():
    twin = "The customer Snowflake account uses key pair auth with Azure AD."
    assert overlap(FACT, twin) == 1.0
    assert is_duplicate(note("a", FACT), note("b", twin), 0.95, 0.9, 0.9)


@pytest.mark.parametrize(
    ("b", "why"),
    [
        ("The customer's Snowflake account uses key-pair auth with Azure AD for 30 days", "number"),
        ("The customer's Snowflake account does not use key-pair auth with Azure AD", "negation"),
        ("The customer's Snowflake account uses password auth with Azure AD", "words"),
    ],
)
def test_other_numbers_negations_or_words_are_not_duplicates(b, why):
    assert not is_duplicate(note("a", FACT), note("b", b), 1.0, 0.9, 0.9), why


def test_cosine_event_kind_and_validity_must_agree():
    a = note("a", FACT)
    assert not is_duplicate(a, note("b", FACT), 0.89, 0.9, 0.9)
    assert not is_duplicate(a, note("b", FACT, event_time=5.0), 1.0, 0.9, 0.9)
    assert not is_duplicate(a, note("b", FACT, kind="insight"), 1.0, 0.9, 0.9)
    assert not is_duplicate(a, note("b", FACT, valid_to=3.0), 1.0, 0.9, 0.9)
    assert not is_duplicate(a, note("a", FACT), 1.0, 0.9, 0.9)
    assert is_duplicate(
        note("a", FACT, event_time=5.0), note("b", FACT, event_time=5.0), 1.0, 0.9, 0.9
    )


def test_the_more_accessed_then_the_older_note_survives():
    old, new = note("b", FACT, created_at=1.0), note("a", FACT, created_at=2.0)
    assert survivor(new, old) == (old, new)
    busy = note("a", FACT, created_at=2.0, access_count=3)
    assert survivor(old, busy) == (busy, old)


def abc() -> dict[str, Text]:
    """Three copies of one fact, a the oldest."""
    return {nid: note(nid, FACT, created_at=float(n)) for n, nid in enumerate(("a", "b", "c"), 1)}


def test_the_most_durable_note_absorbs_every_duplicate_it_is_paired_with() -> None:
    texts = abc()
    near = {"c": [("b", 0.99), ("a", 0.95)], "b": [("a", 0.97)]}

    plan = find_duplicates([texts["b"], texts["c"]], near, texts, 0.9, 0.9)

    assert plan == MergePlan([("a", "b", 0.97), ("a", "c", 0.95)], {})


def test_a_note_merged_away_absorbs_none_and_its_partner_is_left_to_its_survivor() -> None:
    texts = abc()
    near = {"c": [("b", 0.99)], "b": [("a", 0.97)]}  # c never sees a

    plan = find_duplicates([texts["b"], texts["c"]], near, texts, 0.9, 0.9)

    assert plan == MergePlan([("a", "b", 0.97)], {"c": {"a"}})
    assert adopt(plan, texts, {("c", "a"): 0.96}, 0.9, 0.9) == [("a", "c", 0.96)]
    assert adopt(plan, texts, {("c", "a"): 0.5}, 0.9, 0.9) == []  # not a duplicate of a
    assert adopt(plan, texts, {}, 0.9, 0.9) == []  # no vector to compare


def test_the_cursor_stops_before_the_first_unsettled_note() -> None:
    fresh = [("x", 4), ("y", 7), ("z", 9)]

    assert settled_up_to(fresh, set()) == 9
    assert settled_up_to(fresh, {"z", "y"}) == 6
    assert settled_up_to(fresh, {"x"}) == 3
