"""worker.index.rows: which rows a search may use."""

from __future__ import annotations

from typing import Any

from worker.index.rows import CHECK_ROWS, MAX_ROWS, MIN_USES, PAUSE_ROWS, Pinned, RowCache


def one(pinned: Pinned, nid: str) -> Any:
    """The rank row kept for ``nid``, else None."""
    return pinned.get_many("rank", [nid]).get(nid)


def test_rows_hold_while_the_version_and_count_do():
    cache = RowCache()
    held, tag = cache.observe(b"1", 5)
    assert not held  # nothing read yet
    Pinned(cache, tag).put("rank", "a", {"x": 1})
    held, again = cache.observe(b"1", 5)
    assert held and again == tag
    assert one(Pinned(cache, again), "a") == {"x": 1}
    held, moved = cache.observe(b"2", 5)
    assert not held and one(Pinned(cache, moved), "a") is None


def test_another_process_reinforcement_drops_the_rows_and_this_ones_updates_them():
    cache = RowCache()
    _, tag = cache.observe(None, 3)
    Pinned(cache, tag).put("rank", "a", {"last_access": "1.0"})
    cache.reinforced(["rank"], ["a"], 9.0, 4)  # this process's INCR: 3 -> 4
    held, tag = cache.observe(None, 4)
    assert held and one(Pinned(cache, tag), "a") == {"last_access": "9.0"}
    held, tag = cache.observe(None, 5)  # someone else's
    assert not held and one(Pinned(cache, tag), "a") is None
    Pinned(cache, tag).put("rank", "a", {"last_access": "9.0"})
    cache.reinforced(["rank"], ["a"], 10.0, 7)  # 6 was someone else's
    held, tag = cache.observe(None, 7)
    assert one(Pinned(cache, tag), "a") is None


def test_a_row_put_under_an_old_tag_is_never_used():
    cache = RowCache()
    _, old = cache.observe(b"1", 0)
    _, new = cache.observe(b"2", 0)
    Pinned(cache, old).put("rank", "a", {"x": 1})  # a search still running over version 1
    assert one(Pinned(cache, new), "a") is None


def test_a_full_tier_drops_its_oldest_rows():
    cache = RowCache()
    _, tag = cache.observe(None, 0)
    pinned = Pinned(cache, tag)
    for i in range(MAX_ROWS + 1):
        pinned.put("rank", f"n{i}", i)
    assert one(pinned, "n0") is None
    assert one(pinned, f"n{MAX_ROWS // 10}") == MAX_ROWS // 10
    assert one(pinned, f"n{MAX_ROWS}") == MAX_ROWS


def _put_many(pinned: Pinned, start: int, count: int) -> None:
    for i in range(start, start + count):
        pinned.put("rank", f"n{i}", i)


def test_rows_that_are_dropped_unused_pause_the_keeping():
    cache = RowCache()
    _, tag = cache.observe(None, 0)
    pinned = Pinned(cache, tag)
    first_look_after_full = -(-(MAX_ROWS + 1) // CHECK_ROWS) * CHECK_ROWS
    _put_many(pinned, 0, first_look_after_full)  # a full tier dropped rows nobody used
    assert one(pinned, f"n{first_look_after_full - 1}") is None  # the look dropped all
    _put_many(pinned, 0, PAUSE_ROWS)
    assert all(one(pinned, f"n{i}") is None for i in range(0, PAUSE_ROWS, 97))
    pinned.put("rank", "after", 1)  # the pause is over
    assert one(pinned, "after") == 1


def test_rows_that_are_used_keep_being_kept_when_a_tier_is_full():
    cache = RowCache()
    _, tag = cache.observe(None, 0)
    pinned = Pinned(cache, tag)
    for i in range(MAX_ROWS + 2 * CHECK_ROWS):
        pinned.put("rank", f"n{i}", i)
        if i % (MIN_USES // 2) == 0:
            assert one(pinned, f"n{i}") == i  # twice the share of rows that must be
    assert one(pinned, f"n{MAX_ROWS + 2 * CHECK_ROWS - 1}") is not None


def test_a_cache_warming_up_is_not_paused_however_few_rows_are_used_yet():
    cache = RowCache()
    _, tag = cache.observe(None, 0)
    pinned = Pinned(cache, tag)
    _put_many(pinned, 0, 2 * CHECK_ROWS)  # nothing used, but nothing dropped either
    assert one(pinned, "n0") == 0
    pinned.put("rank", "next", 1)
    assert one(pinned, "next") == 1


def test_rows_dropped_by_new_versions_before_use_pause_the_keeping():
    cache = RowCache()
    for version in range(CHECK_ROWS // 100 + 1):  # a write between every two searches
        _, tag = cache.observe(version, 0)
        _put_many(Pinned(cache, tag), 0, 100)
    _, tag = cache.observe("quiet", 0)
    Pinned(cache, tag).put("rank", "a", 1)
    assert one(Pinned(cache, tag), "a") is None


def test_the_first_look_after_a_pause_pauses_again_without_waiting_for_a_full_tier():
    cache = RowCache()
    _, tag = cache.observe(None, 0)
    pinned = Pinned(cache, tag)
    first_look_after_full = -(-(MAX_ROWS + 1) // CHECK_ROWS) * CHECK_ROWS
    _put_many(pinned, 0, first_look_after_full + PAUSE_ROWS)  # a look paused; the pause ran out
    _put_many(pinned, 0, CHECK_ROWS)  # unused again, and no tier full: paused again
    pinned.put("rank", "paused", 1)
    assert one(pinned, "paused") is None


def test_rows_used_after_a_pause_are_kept_on():
    cache = RowCache()
    _, tag = cache.observe(None, 0)
    pinned = Pinned(cache, tag)
    first_look_after_full = -(-(MAX_ROWS + 1) // CHECK_ROWS) * CHECK_ROWS
    _put_many(pinned, 0, first_look_after_full + PAUSE_ROWS)
    for i in range(CHECK_ROWS):  # the same few notes again and again: every row is used
        if one(pinned, f"r{i % 100}") is None:
            pinned.put("rank", f"r{i % 100}", i)
        pinned.put("rank", f"x{i}", i)
    assert one(pinned, "r1") is not None
