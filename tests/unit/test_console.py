"""What the CLI prints: ISO 8601 times in UTC, tables or JSON lines, words for nothing."""

from __future__ import annotations

import json

import pytest

from worker.cli.console import Printer
from worker.readable import iso_time, readable


def test_epoch_times_become_iso_8601_in_utc_nested_ones_too() -> None:
    assert iso_time(1_796_160_600.4) == "2026-12-01T21:30:00Z"
    row = {
        "id": "a",
        "created_at": 1_796_160_600.0,
        "last_access": 0.0,
        "score": 0.5,
        "last": {"ingest": 1_796_160_600.0},
        "jobs": {"evict": {"job": "evict", "at": 1_796_160_600.0}},
    }
    assert readable(row) == {
        "id": "a",
        "created_at": "2026-12-01T21:30:00Z",
        "last_access": None,
        "score": 0.5,
        "last": {"ingest": "2026-12-01T21:30:00Z"},
        "jobs": {"evict": {"job": "evict", "at": "2026-12-01T21:30:00Z"}},
    }


def test_rows_print_a_table_json_lines_or_words_for_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [{"id": "n1", "content": "[bold]not markup[/bold]", "at": 1_796_160_600.0}]
    Printer().rows(rows, ("id", "content"), "no matches")
    table = capsys.readouterr().out
    assert "n1" in table and "[bold]not markup[/bold]" in table and "at" not in table
    Printer(as_json=True).rows(rows, ("id",), "no matches")
    assert json.loads(capsys.readouterr().out)["at"] == "2026-12-01T21:30:00Z"
    Printer().rows([], ("id",), "no matches")
    assert capsys.readouterr().out == "no matches\n"
    Printer(as_json=True).rows([], ("id",), "no matches")
    assert capsys.readouterr().out == ""


def _deep(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": [value]}
    return value


@pytest.mark.parametrize("as_json", [True, False])
def test_whatever_redis_holds_prints_without_an_error(
    as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    note = {
        "id": "a",
        "metadata": {"raw": b"\x00\xff", b"bytes key": 1, 7: "int key", "deep": _deep(3_000)},
        "importance": float("nan"),
        "created_at": 1e300,
        "event_time": float("inf"),
    }

    Printer(as_json=as_json).record(note)
    Printer(as_json=as_json).rows([note], ["id", "metadata"], "none")

    out = capsys.readouterr().out
    assert "base64:AP8=" in out
    if as_json:
        shown = json.loads(out.splitlines()[0])
        assert shown["metadata"]["bytes key"] == 1 and shown["metadata"]["7"] == "int key"
        assert shown["importance"] == "nan" and shown["created_at"] == 1e300
        assert "..." in out


def test_nesting_deeper_than_shown_prints_as_an_ellipsis() -> None:
    shown = readable({"m": _deep(100)})
    depth = 0
    value: object = shown["m"]
    while isinstance(value, dict):
        value = value["k"][0]
        depth += 1
    assert value == "..." and depth < 100
