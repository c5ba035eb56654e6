"""Every transaction that changes what a search reads of a namespace's notes also INCRs that
namespace's version (``Keys.version``), or search processes would rank by rows they keep from
before the change (worker/index/rows.py). The suite checks every MULTI/EXEC any test runs in
this process (``guard``, autouse in tests/conftest.py) but those a test's own code runs to lay
out its data: a new writer that forgets the version fails the tests that exercise it."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from redis.client import Pipeline

from worker.bulk import BulkTransaction

#: a namespace key: prefix, {namespace}, kind, rest
KEY = re.compile(rb"^.+?:\{(?P<ns>[^}]*)\}:(?P<kind>[a-z_]+)(?::|$)")
#: note fields a search's reinforcement writes: they do not change the version
ACCESS_FIELDS = {b"access_count", b"last_access"}
#: writes by command: which arguments after the key are field names
FIELD_ARGS: dict[bytes, Callable[[Sequence[bytes]], Sequence[bytes]]] = {
    b"HSET": lambda rest: rest[0::2],
    b"HMSET": lambda rest: rest[0::2],
    b"HSETNX": lambda rest: rest[:1],
    b"HINCRBY": lambda rest: rest[:1],
    b"HINCRBYFLOAT": lambda rest: rest[:1],
    b"HDEL": lambda rest: rest,
}
WHOLE = {b"DEL", b"UNLINK", b"ZADD", b"ZREM", b"ZINCRBY"}  #: writes that change a key as a whole
#: the modules a transaction passes through between whoever runs it and the check
PLUMBING = (
    "/redis/",
    "/worker/bulk.py",
    "/worker/store/lease.py",
    "/contextlib.py",
    __file__,
)


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def changed_namespaces(commands: Sequence[tuple[Sequence[Any], Any]]) -> tuple[set[str], set[str]]:
    """(namespaces whose notes, links or active set the commands change, namespaces whose
    version they INCR)."""
    changed, bumped = set(), set()
    for args, _ in commands:
        if len(args) < 2:
            continue
        name, key = _bytes(args[0]).upper(), _bytes(args[1])
        found = KEY.match(key)
        if found is None:
            continue
        ns, kind = found["ns"].decode(), found["kind"]
        if name == b"INCR" and kind == b"version":
            bumped.add(ns)
        elif kind == b"active" and name in WHOLE:
            changed.add(ns)
        elif kind in (b"note", b"links") and name in WHOLE:
            changed.add(ns)
        elif kind in (b"note", b"links") and name in FIELD_ARGS:
            names = {_bytes(f) for f in FIELD_ARGS[name]([_bytes(a) for a in args[2:]])}
            if kind == b"links" or names - ACCESS_FIELDS:
                changed.add(ns)
    return changed, bumped


def run_by_a_test() -> bool:
    """Whether the transaction being checked was run by a test's own code (not through
    zettelq's)."""
    frame = sys._getframe(1)
    while frame is not None and any(part in frame.f_code.co_filename for part in PLUMBING):
        frame = frame.f_back  # type: ignore[assignment]
    return frame is not None and "/tests/" in frame.f_code.co_filename


def check(commands: Sequence[tuple[Sequence[Any], Any]]) -> None:
    changed, bumped = changed_namespaces(commands)
    missing = changed - bumped
    assert not missing, f"a transaction changed notes of {sorted(missing)} without their version"


@contextmanager
def guard() -> Iterator[None]:
    """Check every transaction run in this process while inside."""
    with pytest.MonkeyPatch.context() as patch:
        for cls in (Pipeline, BulkTransaction):
            real = cls._execute_transaction

            def checked(
                self: Any, connection: Any, commands: Any, *a: Any, _real: Any = real
            ) -> Any:
                if not run_by_a_test():
                    check(commands)
                return _real(self, connection, commands, *a)

            patch.setattr(cls, "_execute_transaction", checked)
        yield
