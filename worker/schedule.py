"""The beat schedule (pure): periodic maintenance tasks and their intervals."""

from __future__ import annotations

from worker.settings import WorkerSettings


def build_beat_schedule(s: WorkerSettings) -> dict[str, dict[str, object]]:
    due = {
        "zq.evict": s.evict_every_s,
        "zq.snapshot": s.snapshot_every_s,
        "zq.importance": s.importance_every_s,
        "zq.consolidate": s.consolidate_every_s,
    }
    # expire just before the next run is due, so a stalled worker never piles up duplicates
    return {n: {"task": n, "schedule": t, "options": {"expires": 0.9 * t}} for n, t in due.items()}
