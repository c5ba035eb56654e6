"""The beat schedule (pure): one entry per periodic job of worker.organise.periodic.JOBS.
(Snapshots are not beat's: each process saves its own projections, see
worker/runtime/snapshotter.py.)

Entry ``zq.<job>`` sends task ``zq.periodic`` with the job's name every ``interval_s`` seconds.
"""

from __future__ import annotations

from worker.organise.periodic import JOBS, interval_s
from worker.settings import WorkerSettings


def build_beat_schedule(s: WorkerSettings) -> dict[str, dict[str, object]]:
    entries: dict[str, tuple[str, list[str], float]] = {
        f"zq.{job}": ("zq.periodic", [job], interval_s(s, job)) for job in JOBS
    }
    # expire just before the next run is due, so a stalled worker never piles up duplicates
    return {
        name: {"task": task, "args": args, "schedule": every, "options": {"expires": 0.9 * every}}
        for name, (task, args, every) in entries.items()
    }
