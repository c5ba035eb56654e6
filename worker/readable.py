"""How a stored value reads for people and for JSON: epoch times as ISO 8601 in UTC
(``2026-12-01T21:30:00Z``), bytes as base64, every key a str, and what Redis holds (untrusted)
bounded in depth. Used by the ``zettelq`` commands and the graph explorer."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

#: field names whose numbers are epoch seconds (0 = never)
TIME_KEYS = frozenset(
    {"at", "created_at", "updated_at", "event_time", "valid_to", "last_access", "as_of"}
)
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
