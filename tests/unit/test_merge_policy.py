"""The near-duplicate rule (pure): same words, same numbers, same negations, same event,
high cosine; and which of the two survives."""

from __future__ import annotations

import pytest

from worker.merge import find_duplicates, is_duplicate, overlap, survivor
from worker.pairs import Text


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


def test_each_note_is_in_at_most_one_pair_most_similar_first():
    a, b, c = (
        note("a", FACT, created_at=1.0),
        note("b", FACT, created_at=2.0),
        note("c", FACT, created_at=3.0),
    )
    texts = {t.id: t for t in (a, b, c)}
    near = {"c": [("b", 0.99), ("a", 0.95)], "b": [("a", 0.97)]}
    assert find_duplicates([b, c], near, texts, 0.9, 0.9) == [("b", "c", 0.99)]
