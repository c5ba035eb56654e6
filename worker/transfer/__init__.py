"""Memories in and out as files: a namespace exported as JSONL (``export``, format v1,
docs/transfer.md) and files imported onto a namespace's inbox (``importer``: a zettelq export
restored exactly, text, content JSONL or mem0's output). The commands are in cli/transfer.py."""

from worker.transfer.export import export_lines, write_export
from worker.transfer.importer import import_stream

__all__ = ["export_lines", "import_stream", "write_export"]
