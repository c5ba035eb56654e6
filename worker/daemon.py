"""The background threads of a worker process (dispatcher, searcher heartbeat, snapshots): a
named daemon thread that runs ``_run`` until ``stop()`` sets ``_stop`` and joins it."""

from __future__ import annotations

import threading
from typing import Self


class Daemon:
    """Subclasses set ``thread_name`` and implement ``_run``, returning once ``_stop`` is set."""

    thread_name = "zq-daemon"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        raise NotImplementedError
