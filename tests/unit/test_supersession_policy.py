"""The supersession rule (pure): explicit changes in a newer note against what an older note
states. Positives must fire with the right evidence; the negatives must not."""

from __future__ import annotations

import pytest

from worker.organise.pairs import Text
from worker.organise.supersession_rule import Change, change_of, judge_pair, statements_of

REACT = "We chose React for the frontend because the team knows it well."


def note(content: str, at: float, *, kind: str = "note", valid_to: float | None = None) -> Text:
    return Text(
        id=f"n{at}",
        content=content,
        kind=kind,
        at=at,
        active=True,
        valid_to=valid_to,
        superseded_by=None,
        access_count=0,
        created_at=at,
        event_time=None,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("We are switching the frontend to Svelte.", Change("frontend", None, "svelte")),
        ("We moved from React to Svelte.", Change(None, "react", "svelte")),
        ("Moved from React to Svelte.", Change(None, "react", "svelte")),
        ("Ported the backend from Python to Go1.22.", Change("backend", "python", "go1.22")),
        ("We replaced React with Svelte.", Change(None, "react", "svelte")),
        ("React was replaced by Svelte last week.", Change(None, "react", "svelte")),
        ("We now use Svelte instead of React.", Change(None, "react", "svelte")),
        ("The frontend now uses Svelte.", Change("frontend", None, "svelte")),
        ("We no longer use React.", Change(None, "react", None)),
        (
            "Migrated the database from Postgres to CockroachDB.",
            Change("databas", "postgres", "cockroachdb"),
        ),
    ],
)
def test_explicit_changes_are_read(text, expected):
    assert expected in change_of(text)


@pytest.mark.parametrize(
    "text",
    [
        "Should we switch the frontend to Svelte?",
        "We might switch the frontend to Svelte.",
        "We plan to move the frontend to Svelte.",
        "If React stays slow we switch the frontend to Svelte.",
        "We are not switching the frontend to Svelte.",
        "We decided against moving from React to Svelte.",
        "We are switching the frontend to something faster.",
        "We switched to Svelte.",  # no subject and no old value: nothing to match
        "Client called. They are unhappy with React performance on low-end devices.",
    ],
)
def test_hedged_vague_or_plain_notes_state_no_change(text):
    assert change_of(text) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (REACT, ("frontend", "react")),
        (
            "The backend must be Python to support the data science libraries.",
            ("backend", "python"),
        ),
        ("The frontend is built with React.", ("frontend", "react")),
        ("Our CI runs on Jenkins.", ("ci", "jenkins")),
    ],
)
def test_older_statements_are_read(text, expected):
    assert expected in statements_of(text)


@pytest.mark.parametrize(
    "text",
    [
        "The frontend is slow on old phones.",
        "We use a dark theme on the frontend.",
        "Lunch is at noon.",
    ],
)
def test_statements_need_a_named_value(text):
    assert statements_of(text) == []


@pytest.mark.parametrize(
    "new",
    [
        "We are switching the frontend to Svelte for better performance.",
        "We moved from React to Svelte.",
        "The frontend now uses Svelte.",
        "We no longer use React.",
        "We switched the frontend framework from React to Svelte.",
    ],
)
def test_a_change_supersedes_the_matching_older_statement(new):
    why = judge_pair(note(new, 2.0), note(REACT, 1.0))
    assert why is not None and why.startswith("frontend: react -> ")


@pytest.mark.parametrize(
    ("new", "old"),
    [
        # another subject
        ("We are switching the frontend to Svelte.", "The backend must be Python."),
        # the old note names no value for the subject
        ("We are switching the frontend to Svelte.", "The frontend team meets on Tuesdays."),
        # mentions the old value without stating it
        ("We moved from React to Svelte.", "They are unhappy with React performance."),
        # the old note already has the new value
        ("We are switching the frontend to Svelte.", "We chose Svelte for the frontend."),
        (
            "We are switching the frontend to Svelte.",
            "We use React for the frontend and Svelte for widgets.",
        ),
        # the old value does not match
        ("We moved the frontend from Vue to Svelte.", REACT),
        # hedged
        ("Maybe we should switch the frontend to Svelte.", REACT),
        # about another project
        (
            "Project Zeus is switching the frontend to Svelte.",
            "Apollo chose React for the frontend.",
        ),
    ],
)
def test_non_matching_pairs_are_left_alone(new, old):
    assert judge_pair(note(new, 2.0), note(old, 1.0)) is None


@pytest.mark.parametrize(
    ("new", "old"),
    [
        ("Apollo is switching the frontend to Svelte.", "Apollo chose React for the frontend."),
        ("Team update: switching the frontend to Svelte.", "Frontend uses React."),
        ("Zeus is switching the frontend to Svelte.", REACT),
    ],
)
def test_names_only_keep_apart_notes_that_each_name_something_else(new, old):
    assert judge_pair(note(new, 2.0), note(old, 1.0)) is not None


def test_only_a_newer_valid_plain_note_supersedes_a_valid_plain_note():
    switch = "We are switching the frontend to Svelte."
    assert judge_pair(note(switch, 1.0), note(REACT, 2.0)) is None  # older change
    assert judge_pair(note(switch, 2.0), note(REACT, 1.0, valid_to=1.5)) is None
    assert judge_pair(note(switch, 2.0), note(REACT, 1.0, kind="insight")) is None
    assert judge_pair(note(switch, 2.0, valid_to=3.0), note(REACT, 1.0)) is None
    assert judge_pair(note(switch, 2.0), note(REACT, 1.0)) is not None
