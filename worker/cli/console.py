"""What a ``zettelq`` command prints: a table on stdout for people, or with ``--json`` one JSON
object per line for scripts. Epoch times become ISO 8601 in UTC (``2026-12-01T21:30:00Z``), and
an empty result says so in words ("no matches") where a table would print nothing."""

from __future__ import annotations

import argparse
import base64
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from worker.settings import WorkerSettings

#: what runs one subcommand: its settings, parsed arguments and the arguments it did not know
Handler = Callable[[WorkerSettings, argparse.Namespace, list[str]], int]

#: field names whose numbers are epoch seconds (0 = never)
TIME_KEYS = frozenset(
    {"at", "created_at", "updated_at", "event_time", "valid_to", "last_access", "as_of"}
)
#: columns whose text wraps in a table; the others (ids, numbers, times) are kept whole
WRAPPED = frozenset({"content", "reason", "problems", "fields"})
#: field names whose mapping values are epoch seconds (Stats.last: job -> time)
TIME_MAPS = frozenset({"last"})


#: nesting shown in full; deeper values print as "..." (what Redis holds is untrusted)
MAX_SHOWN_DEPTH = 32


def iso_time(ts: float) -> str:
    """Epoch seconds as ISO 8601 in UTC to the second: ``2026-12-01T21:30:00Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def readable(row: Mapping[str, object]) -> dict[str, object]:
    """``row`` as plain JSON: every epoch time in it (nested ones too) as ISO 8601 (0 becomes
    None), bytes as ``base64:...``, keys as str, non-finite numbers as str, and values nested
    deeper than ``MAX_SHOWN_DEPTH`` as "..."; whatever a note holds, json.dumps takes it."""
    return _readable_map(row, 0)


def _readable_map(row: Mapping[Any, object], depth: int) -> dict[str, object]:
    return {_key(key): _readable_value(_key(key), value, depth + 1) for key, value in row.items()}


def _key(key: object) -> str:
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)


def _readable_value(key: str, value: object, depth: int) -> object:
    if depth > MAX_SHOWN_DEPTH:
        return "..."
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return _readable_number(key, value)
    if isinstance(value, bytes):
        return "base64:" + base64.b64encode(value).decode()
    if key in TIME_MAPS and isinstance(value, Mapping):
        return {_key(k): _readable_value("at", v, depth + 1) for k, v in value.items()}
    if isinstance(value, Mapping):
        return _readable_map(value, depth)
    if isinstance(value, list | tuple):
        return [_readable_value("", v, depth + 1) for v in value]
    return str(value)


def _readable_number(key: str, value: float) -> object:
    if not math.isfinite(value):
        return str(value)
    if key not in TIME_KEYS:
        return value
    if value <= 0:
        return None
    try:
        return iso_time(value)
    except (OverflowError, ValueError, OSError):
        return value


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--json`` on a subcommand that prints results."""
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per line instead of a table"
    )


@dataclass(frozen=True)
class Printer:
    """Prints a command's results as tables and lines, or as JSON lines when ``as_json``."""

    as_json: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace) -> Printer:
        return cls(as_json=bool(getattr(args, "json", False)))

    def rows(
        self, rows: Iterable[Mapping[str, object]], columns: Sequence[str], empty: str
    ) -> None:
        """A table of ``columns`` (JSON: every field of each row), or ``empty`` when none."""
        shown = [readable(row) for row in rows]
        if self.as_json:
            for row in shown:
                self._write(json.dumps(row, default=str))
        elif not shown:
            self._write(empty)
        else:
            table = Table(box=box.SIMPLE_HEAD)
            for column in columns:
                table.add_column(column, no_wrap=column not in WRAPPED)
            for row in shown:
                table.add_row(*(Text(cell(row.get(c))) for c in columns))
            self._print(table)

    def record(self, row: Mapping[str, object]) -> None:
        """One object: a two-column table of its fields (JSON: one line)."""
        shown = readable(row)
        if self.as_json:
            self._write(json.dumps(shown, default=str))
            return
        table = Table(show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        for key, value in shown.items():
            table.add_row(Text(key), Text(cell(value)))
        self._print(table)

    def message(self, text: str, /, **fields: object) -> None:
        """A sentence for people; ``fields`` as one JSON object for scripts."""
        self._write(json.dumps(fields, default=str) if self.as_json else text)

    def _write(self, text: str) -> None:
        sys.stdout.write(text + "\n")

    def _print(self, table: Table) -> None:
        Console(file=sys.stdout, highlight=False).print(table)


def cell(value: object) -> str:
    """A table cell: floats to 3 decimals, mappings and lists as compact JSON, None empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, Mapping | list):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)
