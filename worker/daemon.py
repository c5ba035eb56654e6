"""The background threads of a worker process (dispatcher, heartbeats, search and organise
servers, snapshots): named daemon threads that call ``step`` until ``stop()``, and heal.

A step that raises does not end its thread, whatever the error: a Redis connection drop, but also
an error reply (OOM under ``maxmemory``, BUSY from a long script, MISCONF, READONLY after a
failover, WRONGTYPE at a key a tenant planted) or a bug. The thread waits (0.1 s, doubling to 5 s)
and steps again, so it resumes by itself once Redis (or the data) recovers. Each kind of error is
logged once per failing spell (a traceback only for errors that are not Redis's) and the recovery
once, so a Redis that is down for an hour writes a few lines, not thousands.

Every started daemon is in a registry of its process: ``problems()`` names the threads that died
or have failed without a success for UNHEALTHY_AFTER_S, which the process heartbeat reports
(worker/runtime/heartbeat.py) and the search heartbeat acts on (worker/search/routing.py).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Self

from redis.exceptions import RedisError

from worker import metrics

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.1  #: the wait after a first failure; it doubles per failure in a row
MAX_BACKOFF_S = 5.0  #: the longest wait between two failing steps
UNHEALTHY_AFTER_S = 30.0  #: a thread failing this long without a success counts as unhealthy

#: Step: what one iteration of a thread calls
Step = Callable[[], object]

_started: weakref.WeakSet[Daemon] = weakref.WeakSet()
_started_lock = threading.Lock()


@dataclass
class Watch:
    """One thread's failures: the spell it is in (if any) and the counts by kind of error."""

    failing_since: float | None = None
    in_a_row: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    _logged: set[str] = field(default_factory=set)

    def failed(self, thread: str, exc: Exception) -> float:
        """Count ``exc``, log it if its kind is new in this spell; return the wait before the
        next step."""
        kind = type(exc).__name__
        self.errors[kind] += 1
        metrics.count_thread_error(thread, kind)
        self.in_a_row += 1
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        delay = min(FIRST_BACKOFF_S * 2.0 ** min(self.in_a_row - 1, 16), MAX_BACKOFF_S)
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "%s failed (%s: %s); retrying, every %.1fs at most",
                thread,
                kind,
                exc,
                MAX_BACKOFF_S,
                exc_info=not isinstance(exc, RedisError),
            )
        return delay

    def succeeded(self, thread: str) -> None:
        """End the failing spell, if any, with one line."""
        if self.failing_since is None:
            return
        log.warning(
            "%s recovered after %d failures in %.1fs",
            thread,
            self.in_a_row,
            time.monotonic() - self.failing_since,
        )
        self.failing_since, self.in_a_row = None, 0
        self._logged.clear()

    def failing_for(self, now: float) -> float:
        """Seconds since the last success, while failing (0 when not)."""
        return 0.0 if self.failing_since is None else now - self.failing_since


class Daemon:
    """Subclasses set ``thread_name`` and implement ``step``, or ``session`` when each thread
    needs resources of its own; ``interval_s`` is the wait after each successful step (0: the
    step waits itself, in a blocking read); ``wait_first`` waits one interval before the first.
    ``threads=N`` runs N threads named ``<thread_name>-<i>``; by default one, ``thread_name``."""

    thread_name = "zq-daemon"
    interval_s = 0.0
    wait_first = False

    def __init__(self, threads: int | None = None) -> None:
        self._stop = threading.Event()
        names = (
            [self.thread_name]
            if threads is None
            else [f"{self.thread_name}-{i}" for i in range(threads)]
        )
        self._threads = [threading.Thread(target=self._main, name=n, daemon=True) for n in names]
        self.watches = {n: Watch() for n in names}

    def start(self) -> Self:
        with _started_lock:
            _started.add(self)
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)
        with _started_lock:
            _started.discard(self)

    def session(self) -> AbstractContextManager[Step]:
        """What one thread opens (its connection) and the step it calls, closed when the thread
        ends; by default nothing and ``step``."""
        return nullcontext(self.step)

    def step(self) -> object:
        """One iteration of the thread."""
        raise NotImplementedError

    def problems(self, now: float | None = None) -> list[str]:
        """``thread: why`` for each thread of this daemon that died or fails for too long."""
        now = time.monotonic() if now is None else now
        found = []
        for t in self._threads:
            watch = self.watches[t.name]
            if t.ident is not None and not t.is_alive() and not self._stop.is_set():
                found.append(f"{t.name}: dead")
            elif watch.failing_for(now) > UNHEALTHY_AFTER_S:
                kinds = ",".join(sorted(watch.errors))
                found.append(f"{t.name}: failing for {watch.failing_for(now):.0f}s ({kinds})")
        return found

    def _main(self) -> None:
        name = threading.current_thread().name
        watch = self.watches[name]
        if self.wait_first and self._stop.wait(self.interval_s):
            return
        with self.session() as step:
            while not self._stop.is_set():
                try:
                    step()
                except Exception as exc:
                    self._stop.wait(watch.failed(name, exc))
                    continue
                watch.succeeded(name)
                if self.interval_s:
                    self._stop.wait(self.interval_s)


def problems() -> list[str]:
    """What is wrong with this process's running daemons (empty when every thread is well)."""
    with _started_lock:
        daemons = list(_started)
    now = time.monotonic()
    return [p for d in daemons for p in d.problems(now)]


def error_counts() -> Counter[str]:
    """The errors this process's running daemons survived, by kind."""
    with _started_lock:
        daemons = list(_started)
    total: Counter[str] = Counter()
    for d in daemons:
        for watch in d.watches.values():
            total.update(watch.errors)
    return total
