"""The Snowball English stemmer in C (PyStemmer, which snowballstemmer uses when it is installed)
and snowballstemmer's own Python one stem alike, so workers with and without the C one index and
query the same terms (a platform without a PyStemmer wheel falls back to the Python one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import snowballstemmer
from snowballstemmer.english_stemmer import EnglishStemmer

ROOT = Path(__file__).resolve().parents[2]


def words_of_the_docs() -> list[str]:
    text = " ".join(p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md")])
    return sorted({w for w in re.findall(r"[^\W\d_]+", text.lower()) if len(w) > 1})


def test_the_stemmer_in_use_is_the_c_one() -> None:
    pytest.importorskip("Stemmer", reason="PyStemmer comes with the worker extra")
    assert type(snowballstemmer.stemmer("english")).__module__ == "Stemmer"


def test_the_c_and_python_stemmers_stem_every_word_of_the_docs_alike() -> None:
    c_stemmer = pytest.importorskip("Stemmer").Stemmer("english")
    python_stemmer = EnglishStemmer()
    words = words_of_the_docs()
    assert len(words) > 2_000
    differ = [w for w in words if c_stemmer.stemWord(w) != python_stemmer.stemWord(w)]
    assert differ == []
