"""worker.index.rows: which rows a search may use."""

from __future__ import annotations

from worker.index.rows import MAX_ROWS, Pinned, RowCache


def test_rows_hold_while_the_version_and_count_do():
    cache = RowCache()
    held, tag = cache.observe(b"1", 5)
    assert not held  # nothing read yet
    Pinned(cache, tag).put("rank", "a", {"x": 1})
    held, again = cache.observe(b"1", 5)
    assert held and again == tag
    assert Pinned(cache, again).get("rank", "a") == {"x": 1}
    held, moved = cache.observe(b"2", 5)
    assert not held and Pinned(cache, moved).get("rank", "a") is None


def test_another_process_reinforcement_drops_the_rows_and_this_ones_updates_them():
    cache = RowCache()
    _, tag = cache.observe(None, 3)
    Pinned(cache, tag).put("rank", "a", {"last_access": "1.0"})
    cache.reinforced(["rank"], ["a"], 9.0, 4)  # this process's INCR: 3 -> 4
    held, tag = cache.observe(None, 4)
    assert held and Pinned(cache, tag).get("rank", "a") == {"last_access": "9.0"}
    held, tag = cache.observe(None, 5)  # someone else's
    assert not held and Pinned(cache, tag).get("rank", "a") is None
    Pinned(cache, tag).put("rank", "a", {"last_access": "9.0"})
    cache.reinforced(["rank"], ["a"], 10.0, 7)  # 6 was someone else's
    held, tag = cache.observe(None, 7)
    assert Pinned(cache, tag).get("rank", "a") is None


def test_a_row_put_under_an_old_tag_is_never_used():
    cache = RowCache()
    _, old = cache.observe(b"1", 0)
    _, new = cache.observe(b"2", 0)
    Pinned(cache, old).put("rank", "a", {"x": 1})  # a search still running over version 1
    assert Pinned(cache, new).get("rank", "a") is None


def test_a_full_tier_drops_its_oldest_rows():
    cache = RowCache()
    _, tag = cache.observe(None, 0)
    pinned = Pinned(cache, tag)
    for i in range(MAX_ROWS + 1):
        pinned.put("rank", f"n{i}", i)
    assert pinned.get("rank", "n0") is None
    assert pinned.get("rank", f"n{MAX_ROWS // 10}") == MAX_ROWS // 10
    assert pinned.get("rank", f"n{MAX_ROWS}") == MAX_ROWS
