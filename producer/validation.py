"""Input checks shared by the client (before anything is written) and the worker (poison jobs).

Every function raises ``InvalidInput`` with a message naming the argument and the limit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgpack

from producer.errors import InvalidInput
from producer.settings import ProducerSettings

NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.:@/-]{1,128}")  #: no braces: they are the hash tag
ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  #: note ids
MAX_AGENT_CHARS = 128  #: longest agent name
MAX_HOPS = 3  #: deepest graph expansion a search may ask for
MAX_TIMEOUT_S = 300.0  #: longest wait for a reply
MAX_NAMESPACES = 16  #: most namespaces one search may cover
MIN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS = 16, 1_000_000  #: bounds of context()'s max_tokens
WEIGHT_KEYS = frozenset(
    {"dense", "lexical", "graph", "feedback"}
)  #: channels a search may reweight
FILTER_KEYS = frozenset({"agent", "kind", "tags", "since", "until", "metadata"})  #: search filters
JSON_LIKE = "metadata values must be JSON-like (str, finite number, bool, None, list, mapping)"
MAX_METADATA_DEPTH = 16  #: deepest nesting of lists and mappings inside metadata
#: earliest and latest time accepted (epoch seconds): 0001-01-02 and about year 5138, so that a
#: time shifted by any UTC offset still renders as a date; larger numbers are milliseconds
MIN_EPOCH_S = datetime(1, 1, 2, tzinfo=UTC).timestamp()
MAX_EPOCH_S = 1e11


def check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not NAMESPACE_RE.fullmatch(namespace):
        raise InvalidInput(
            f"namespace must be 1-128 characters of A-Z a-z 0-9 _ . : @ / -, got {namespace!r:.80}"
        )
    return namespace


def check_id(note_id: object) -> str:
    if not isinstance(note_id, str) or not ID_RE.fullmatch(note_id):
        raise InvalidInput(
            f"id must be 1-128 characters of A-Z a-z 0-9 _ . : -, got {note_id!r:.80}"
        )
    return note_id


def check_text(text: object, name: str, max_bytes: int) -> str:
    if not isinstance(text, str):
        raise InvalidInput(f"{name} must be a str, got {type(text).__name__}")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{name} is not valid Unicode text (lone surrogate)") from exc
    if not text.strip():
        raise InvalidInput(f"{name} must not be empty")
    if size > max_bytes:
        raise InvalidInput(
            f"{name} is {size} bytes; the limit is {max_bytes} (ZQ_MAX_CONTENT_BYTES)"
        )
    if "\x00" in text:
        raise InvalidInput(f"{name} must not contain NUL characters")
    return text


def check_agent(agent: object) -> str | None:
    if agent is None:
        return None
    if not isinstance(agent, str) or not agent.strip() or len(agent) > MAX_AGENT_CHARS:
        raise InvalidInput(f"agent must be a non-empty str of at most {MAX_AGENT_CHARS} characters")
    check_text(agent, "agent", MAX_AGENT_CHARS * 4)
    return agent


def check_metadata(metadata: object, max_bytes: int) -> dict[str, Any]:
    """A mapping of JSON values: str keys at every level, str / finite number / bool / None /
    list / mapping values, at most ``MAX_METADATA_DEPTH`` levels deep and ``max_bytes`` packed."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise InvalidInput("metadata must be a mapping with str keys")
    if not metadata:
        return {}
    _check_json(metadata, "metadata", 1)
    try:
        packed = msgpack.packb(dict(metadata), use_bin_type=True, strict_types=False)
        unpacked: dict[str, Any] = msgpack.unpackb(packed, raw=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"{JSON_LIKE}: {exc}") from exc
    if len(packed) > max_bytes:
        raise InvalidInput(
            f"metadata is {len(packed)} packed bytes; the limit is {max_bytes} "
            "(ZQ_MAX_METADATA_BYTES)"
        )
    return unpacked


def _check_json(value: object, where: str, depth: int) -> None:
    """Raise InvalidInput unless ``value`` is a JSON value that every read path can render."""
    if isinstance(value, str):
        _check_unicode(value, where)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{JSON_LIKE}: {where} is {value}")
    elif isinstance(value, Mapping | list | tuple):
        if depth > MAX_METADATA_DEPTH:
            raise InvalidInput(f"metadata is nested deeper than {MAX_METADATA_DEPTH} levels")
        _check_children(value, where, depth)
    elif value is not None and not isinstance(value, bool | int | float):
        raise InvalidInput(f"{JSON_LIKE}: {where} is a {type(value).__name__}")


def _check_children(
    value: Mapping[object, object] | list[object] | tuple[object, ...], where: str, depth: int
) -> None:
    if not isinstance(value, Mapping):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]", depth + 1)
        return
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidInput(f"{where} has a {type(key).__name__} key; keys must be str")
        _check_unicode(key, where)
        _check_json(item, f"{where}[{key!r:.40}]", depth + 1)


def _check_unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{where} is not valid Unicode text (lone surrogate)") from exc


def check_tags(tags: object, max_tags: int, max_chars: int) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise InvalidInput("tags must be a list of str")
    if len(tags) > max_tags:
        raise InvalidInput(f"{len(tags)} tags; the limit is {max_tags} (ZQ_MAX_TAGS)")
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip() or len(tag) > max_chars:
            raise InvalidInput(
                f"each tag must be a non-empty str of at most {max_chars} characters"
            )
        check_text(tag, "tag", max_chars * 4)
        if tag.strip() not in out:
            out.append(tag.strip())
    return out


def check_time(value: object, name: str) -> float | None:
    """Accept None, epoch seconds, a datetime (naive means UTC) or an ISO 8601 string, between
    ``MIN_EPOCH_S`` and ``MAX_EPOCH_S``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidInput(f"{name} is not an ISO 8601 date/time: {value!r:.40}") from exc
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        try:
            value = value.timestamp()
        except (OverflowError, ValueError) as exc:
            raise InvalidInput(f"{name} is out of range: {exc}") from exc
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if not finite or isinstance(value, bool):
        raise InvalidInput(f"{name} must be a datetime, ISO 8601 str or epoch seconds")
    assert isinstance(value, int | float)
    if value > MAX_EPOCH_S:
        raise InvalidInput(
            f"{name} must be epoch seconds up to 1e11, about the year 5138 "
            f"(got {str(value)[:24]}: milliseconds?)"
        )
    if value < MIN_EPOCH_S:
        raise InvalidInput(f"{name} is before the year 1 (got {str(value)[:24]})")
    return float(value)


def check_unit_float(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InvalidInput(f"{name} must be a number between 0 and 1")
    return float(value)


def check_int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{name} must be an int between {low} and {high}, got {value!r:.40}")
    return value


def check_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput("timeout_s must be a number of seconds")
    if not 0 < value <= MAX_TIMEOUT_S:
        raise InvalidInput(f"timeout_s must be > 0 and <= {MAX_TIMEOUT_S}")
    return float(value)


def check_weights(weights: object) -> dict[str, float]:
    """Per-search channel weights overriding the worker's settings (for ablations)."""
    if weights is None:
        return {}
    if not isinstance(weights, Mapping) or not set(weights) <= WEIGHT_KEYS:
        raise InvalidInput(f"weights must be a mapping with keys among {sorted(WEIGHT_KEYS)}")
    out: dict[str, float] = {}
    for key, value in weights.items():
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not 0 <= value <= 100:
            raise InvalidInput(f"weights[{key!r}] must be a number between 0 and 100")
        out[key] = float(value)
    return out


def check_filters(filters: object, s: ProducerSettings) -> dict[str, Any]:
    """Search filters: agent (str), kind (str), tags (all must match), since/until, metadata."""
    if filters is None:
        return {}
    if not isinstance(filters, Mapping) or not set(filters) <= FILTER_KEYS:
        raise InvalidInput(f"filters must be a mapping with keys among {sorted(FILTER_KEYS)}")
    out: dict[str, Any] = {}
    for key in ("agent", "kind"):
        if filters.get(key) is not None:
            out[key] = check_text(filters[key], f"filters[{key!r}]", MAX_AGENT_CHARS * 4)
    if filters.get("tags"):
        out["tags"] = check_tags(filters["tags"], s.max_tags, s.max_tag_chars)
    for key in ("since", "until"):
        if filters.get(key) is not None:
            out[key] = check_time(filters[key], f"filters[{key!r}]")
    if filters.get("metadata"):
        out["metadata"] = check_metadata(filters["metadata"], s.max_metadata_bytes)
    return out


JOB_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


def check_job_names(jobs: object) -> list[str] | None:
    """organise()'s ``jobs``: None (every job) or 1 to 32 distinct job names."""
    if jobs is None:
        return None
    if isinstance(jobs, str) or not isinstance(jobs, list | tuple) or not 0 < len(jobs) <= 32:
        raise InvalidInput("jobs must be None or a list of 1 to 32 job names")
    for name in jobs:
        if not isinstance(name, str) or not JOB_NAME_RE.fullmatch(name):
            raise InvalidInput(f"job names are 1-32 characters of a-z 0-9 _, got {name!r:.40}")
    if len(set(jobs)) != len(jobs):
        raise InvalidInput("jobs names the same job twice")
    return list(jobs)
