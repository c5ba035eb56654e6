"""What a ``zettelq`` command prints: a table on stdout for people, or with ``--json`` one JSON
object per line for scripts. Epoch times become ISO 8601 in UTC (``2026-12-01T21:30:00Z``), and
an empty result says so in words ("no matches") where a table would print nothing."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from worker.readable import readable
from worker.settings import WorkerSettings

#: what runs one subcommand: its settings, parsed arguments and the arguments it did not know
Handler = Callable[[WorkerSettings, argparse.Namespace, list[str]], int]

#: columns whose text wraps in a table; the others (ids, numbers, times) are kept whole
WRAPPED = frozenset({"content", "reason", "problems", "fields"})


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
