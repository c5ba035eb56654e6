"""How a note's worth fades with time (pure): the recency factor that search ranking, the
importance score and eviction share, halving every ``recency_half_life_days``."""

from __future__ import annotations

import math


def recency(now: float, last_access: float, created_at: float, half_life_s: float) -> float:
    """1.0 for a note touched just now, 0.5 after one half-life, towards 0 after that."""
    age = max(now - max(last_access, created_at), 0.0)
    return math.pow(0.5, age / half_life_s)
