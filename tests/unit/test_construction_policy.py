"""Note construction policy without I/O: the lead-sentence context, cleaning of model words,
atomic note ids, and how a model answer becomes a note's fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.intake import construction
from worker.intake.construction import (
    CONTEXT_MAX_CHARS,
    ConstructAnswer,
    NoteAnswer,
    atom_id,
    atom_ids,
    built_from,
    clean_words,
)
from worker.text import lead_sentence


def test_the_context_is_the_first_sentence_with_whitespace_collapsed() -> None:
    assert lead_sentence("We chose  React.\nThe team knows it. More.") == "We chose React."
    assert lead_sentence("No full stop at all") == "No full stop at all"


def test_a_long_lead_sentence_is_cut_at_a_word_with_an_ellipsis() -> None:
    text = "alpha " * 60 + "end."
    context = lead_sentence(text)
    assert len(context) <= CONTEXT_MAX_CHARS
    assert context.endswith("alpha\u2026")
    assert lead_sentence(text) == context  # deterministic


def test_model_words_are_split_lowercased_and_stripped_of_stop_words() -> None:
    words = ["Frontend Framework", "the", "React", "react", "UI", "2024", "Svelte's"]
    assert clean_words(words) == ["frontend", "framework", "react", "svelte"]
    assert len(clean_words([f"word{i}" for i in range(20)])) == construction.MAX_KEYWORDS


def test_atom_ids_derive_from_the_parent_and_fit_the_id_limit() -> None:
    assert atom_id("note-1", 2) == "note-1:atom:2"
    long_parent = "x" * 128
    ids = atom_ids(long_parent)
    assert len(ids) == construction.MAX_ATOMS == len(set(ids))
    assert all(len(i) <= 128 for i in ids)
    assert ids == atom_ids(long_parent) and ids != atom_ids("y" * 128)


def note(n: int, **extra: object) -> dict[str, object]:
    return {"note": n, "keywords": ["alpha"], "tags": ["topic"], "context": "About alpha.", **extra}


def test_an_answer_may_describe_each_shown_note_once() -> None:
    shown = {"shown": frozenset({1, 2})}
    ok = ConstructAnswer.model_validate({"notes": [note(1), note(2)]}, context=shown)
    assert [n.note for n in ok.notes] == [1, 2]
    bad_answers = (
        [note(1), note(1)],
        [note(3)],
        [note(1, context="  ")],
        [note(1, context="x" * 201)],
    )
    for bad in bad_answers:
        with pytest.raises(ValidationError):
            ConstructAnswer.model_validate({"notes": bad}, context=shown)


def test_atoms_are_kept_only_where_a_split_was_offered_and_when_at_least_two() -> None:
    atom = {"keywords": ["beta"], "tags": [], "context": "Beta."}
    two = [{"content": "Fact one.", **atom}, {"content": "Fact two.", **atom}]
    answer = NoteAnswer.model_validate(note(1, atoms=two), context={"shown": {1}})

    split = built_from(answer, "Fact one. Fact two.", split=True)
    assert [content for content, _ in split.atoms] == ["Fact one.", "Fact two."]
    assert split.keywords == ["topic", "alpha"]  # tags first: they become the note's tags
    assert split.atoms[0][1].keywords == ["beta"]
    assert built_from(answer, "Fact one. Fact two.", split=False).atoms == []

    repeated = NoteAnswer.model_validate(note(1, atoms=[two[0], two[0]]), context={"shown": {1}})
    assert built_from(repeated, "Fact one.", split=True).atoms == []


def test_an_answer_without_usable_words_keeps_the_contents_keywords() -> None:
    answer = NoteAnswer.model_validate(
        {"note": 1, "keywords": ["the", "a"], "tags": [], "context": "x"}, context={"shown": {1}}
    )
    built = built_from(answer, "Postgres stores readings", split=False)
    assert built.keywords == ["postgres", "readings", "stores"]
