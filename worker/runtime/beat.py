"""Beat's scheduler: celery-redbeat's, plus a heartbeat that says whether this beat leads.

celery-redbeat takes its leader lock in a ``beat_init`` handler: a standby blocks there until the
lock is free, and the leader extends the lock on every tick (a tick that cannot extend it raises,
and beat exits). The heartbeat starts before that, when the scheduler is built, so a standby
beats too. Its state is "leader" once a tick extended the lock within the last ``beat_lock_s``
(the lock is then this process's), "standby" while it waits for the lock, and "stale" when it
led but has not extended the lock for that long (a wedged leader: its lock has lapsed).
"""

from __future__ import annotations

import time
from typing import Any

from redbeat import RedBeatScheduler

from worker.runtime.celery_app import settings
from worker.runtime.heartbeat import ProcessHeartbeat


class LeaderScheduler(RedBeatScheduler):  # type: ignore[misc]
    """RedBeatScheduler with a ``beat`` heartbeat, stopped (and deleted) when beat closes it."""

    _heartbeat: ProcessHeartbeat | None = None
    _led_at: float | None = None  #: monotonic time of the last tick that extended the lock

    def setup_schedule(self) -> None:
        """Runs once, when beat builds its scheduler (not for the banner's lazy one)."""
        super().setup_schedule()
        if self._heartbeat is None:
            self._heartbeat = ProcessHeartbeat(settings, "beat", state=self.leadership).start()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval: float = super().tick(*args, **kwargs)
        self._led_at = time.monotonic()
        return interval

    def leadership(self) -> str:
        """leader, standby or stale (see the module docstring); read by the heartbeat thread."""
        if self._led_at is None:
            return "standby"
        fresh = time.monotonic() - self._led_at < float(self.lock_timeout)
        return "leader" if fresh else "stale"

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        super().close()
