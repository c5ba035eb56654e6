from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.text import (
    MAX_KEYWORD_CHARS,
    POSSESSIVES,
    QUOTES,
    STOPWORDS,
    WORD_RE,
    derive_tags,
    extract_keywords,
    tokenize,
)


def test_tokenize_lowercases_and_strips_quotes_and_hyphens() -> None:
    assert tokenize("'Quoted' -dash- Well-Known") == ["quoted", "dash", "well-known"]


@pytest.mark.parametrize(
    ("text", "word"),
    [("customer's", "customer"), ("Customer\u2019s", "customer"), ("customers'", "customers")],
)
def test_tokenize_strips_possessives(text: str, word: str) -> None:
    assert tokenize(text) == [word]


def plain_tokenize(text: str) -> list[str]:
    """The definition: each word without one possessive, then stripped of quote marks and
    hyphens at both ends, empty results dropped."""
    words = [w[:-2] if w.endswith(POSSESSIVES) else w for w in WORD_RE.findall(text.lower())]
    return [w for w in (w.strip(QUOTES) for w in words) if w]


#: Texts made of what tokenize treats specially: quote marks, hyphens, possessives, underscores,
#: letters whose lowercase differs, digits and separators.
TRICKY = st.text(
    alphabet=st.sampled_from(list("'\u2019-_sSaZ9 .\u0130\u00c9\u00df\u03a3\t")), max_size=40
)


@settings(max_examples=3000, deadline=None)
@given(st.one_of(TRICKY, st.text(max_size=60)))
def test_tokenize_is_its_definition(text: str) -> None:
    assert tokenize(text) == plain_tokenize(text)


def test_tokenize_of_words_ending_in_marks() -> None:
    text = "dogs's- x''s x-'s x's's it's' O\u2019Neil\u2019s 9-5's don't-"
    assert tokenize(text) == ["dogs's", "x", "x", "x's", "it's", "o\u2019neil", "9-5", "don't"]
    assert tokenize(text) == plain_tokenize(text)


def test_stop_words_are_dropped() -> None:
    assert extract_keywords("the and of with because would really") == []
    assert extract_keywords("The invoice is with the customer") == ["customer", "invoice"]


def test_every_stop_word_is_lowercase() -> None:
    assert all(w == w.lower() for w in STOPWORDS)


def test_short_words_and_numbers_are_dropped() -> None:
    assert extract_keywords("an ox at 2024 and 42 ok") == []


def test_possessives_merge_with_the_plain_word() -> None:
    assert extract_keywords("the customer's refund; the customer waits")[0] == "customer"


def test_keywords_rank_by_frequency_then_length_then_first_position() -> None:
    text = "beta alpha gamma gamma beta gamma delta epsilon zeta"

    assert extract_keywords(text) == ["gamma", "beta", "epsilon", "alpha", "delta", "zeta"]


def test_max_keywords_limits_the_result() -> None:
    text = "gamma gamma gamma beta beta alpha delta"

    assert extract_keywords(text, max_keywords=2) == ["gamma", "beta"]
    assert extract_keywords(text, max_keywords=0) == []


def test_extract_keywords_of_empty_text_is_empty() -> None:
    assert extract_keywords("") == []
    assert extract_keywords("!!! ... ???") == []


def test_extract_keywords_is_deterministic() -> None:
    text = "Redis streams batch embeddings; FAISS finds neighbours; workers link notes."

    assert extract_keywords(text) == extract_keywords(text)


def test_derive_tags_puts_caller_tags_first_then_keywords() -> None:
    assert derive_tags(["orders", "refund"], ["vip"], max_tags=8) == ["vip", "orders", "refund"]


def test_derive_tags_drops_duplicates() -> None:
    assert derive_tags(["orders", "vip", "refund"], ["vip", "vip"], max_tags=8) == [
        "vip",
        "orders",
        "refund",
    ]


def test_derive_tags_stops_at_max_tags() -> None:
    assert derive_tags(["a1", "b1", "c1", "d1"], ["x"], max_tags=3) == ["x", "a1", "b1"]


def test_derive_tags_keeps_every_caller_tag_even_past_max_tags() -> None:
    assert derive_tags(["kw"], ["a", "b", "c"], max_tags=2) == ["a", "b", "c"]


def test_a_word_longer_than_a_keyword_may_be_is_no_keyword() -> None:
    longest = "k" * MAX_KEYWORD_CHARS

    assert extract_keywords(f"{'z' * 20_000} {longest} token") == [longest, "token"]


def test_derived_tags_leave_out_keywords_longer_than_a_tag_may_be() -> None:
    assert derive_tags(["postgres", "db", "timescaledb"], ["ops"], max_chars=8) == [
        "ops",
        "postgres",
        "db",
    ]
