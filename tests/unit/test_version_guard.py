"""tests/version_guard.py: which transactions change a namespace's notes, and which bump it."""

from __future__ import annotations

import pytest

from producer.keys import Keys
from tests.version_guard import changed_namespaces, check

K = Keys("zq")


def cmds(*commands: tuple[object, ...]) -> list[tuple[tuple[object, ...], dict[str, object]]]:
    return [(c, {}) for c in commands]


@pytest.mark.parametrize(
    "command",
    [
        ("HSET", K.note("a", "n1"), "importance", 0.9),
        ("HSET", K.note("a", "n1"), "last_access", 1.0, "tags", b"\x90"),
        ("HDEL", K.note("a", "n1"), "valid_to"),
        ("HSET", K.links("a", "n1"), "n2", b"x"),
        ("HDEL", K.links("a", "n1"), "n2"),
        ("DEL", K.links("a", "n1")),
        ("ZADD", K.active("a"), 1, "n1"),
        ("ZREM", K.active("a"), "n1"),
    ],
)
def test_a_change_to_what_a_search_reads_needs_the_version(command):
    assert changed_namespaces(cmds(command)) == ({"a"}, set())
    with pytest.raises(AssertionError, match=r"\['a'\]"):
        check(cmds(command))
    check(cmds(command, ("INCR", K.version("a"))))


@pytest.mark.parametrize(
    "command",
    [
        ("HINCRBY", K.note("a", "n1"), "access_count", 1),
        ("HSET", K.note("a", "n1"), "last_access", 1.0),
        ("HSET", K.stats("a"), "links", 3),
        ("XADD", K.audit("a"), "*", "op", "x"),
        ("PEXPIRE", K.lock("a"), 100),
    ],
)
def test_reinforcement_and_bookkeeping_need_no_version(command):
    assert changed_namespaces(cmds(command)) == (set(), set())


def test_the_version_of_one_namespace_does_not_cover_another():
    with pytest.raises(AssertionError, match=r"\['b'\]"):
        check(cmds(("HSET", K.note("b", "n1"), "content", "x"), ("INCR", K.version("a"))))
