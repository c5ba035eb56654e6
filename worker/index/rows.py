"""What searches read about a namespace's notes, kept in the worker process between searches.

A search reads each candidate from Redis in tiers (worker/search/candidates.py): ranking fields,
links, and what a returned hit shows. A namespace is searched again and again over much the
same notes, so a process keeps those rows while two counters of the namespace hold:

- its version (``Keys.version``), which every transaction that changes what a search reads
  increments (note fields, links, which notes are active);
- its reinforcements (``Keys.touches``), which every search that reinforces its hits (access
  count and time) increments in the same round trip as its reply.

A search reads both in its first round trip, beside its freshness check. A new version drops
the rows. So does a reinforcement by another process, but the process's own are applied to its
rows instead (the reply's INCR tells which they are: one more than the last count it knew), or
every search would empty the cache of the next. The rows a search uses are therefore as
current as a read of Redis in its first round trip.

Rows carry the epoch they were read in: a search still running when the rows are dropped puts
its rows under the old epoch, where no later search looks.

Keeping a row costs more than reading it (memory, and every search after it runs slower), so a
cache whose rows are thrown away before they are used stops keeping them for a while: every
``CHECK_ROWS`` rows put, if rows were dropped since the last look (a full tier, or a new
version) and fewer than one row in ``MIN_USES`` put was used, the rows are dropped and the next
``PAUSE_ROWS`` rows read are not kept. That is a namespace searched for ever new notes, too
large for the rows kept, or written to between most of its searches. The first look after a
pause needs no dropped rows to pause again: the tiers start empty then, and would take more
than a look to fill.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any

MAX_ROWS = 10_000  #: rows kept per tier and namespace; past it the oldest tenth are dropped
CHECK_ROWS = 4_096  #: rows put between two looks at whether keeping them pays
MIN_USES = 4  #: keeping pays while at least one row in this many put is used
PAUSE_ROWS = 8 * CHECK_ROWS  #: rows read and not kept after a look found that keeping did not pay
Tag = tuple[object, int]  #: (version read, epoch) that rows are kept under


class RowCache:
    """A namespace's rows by tier and note id, each under the tag it was read at."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: object = None
        self._touches = -1  #: the highest reinforcement count known (-1: none read yet)
        self._epoch = 0
        self._tiers: dict[str, dict[str, tuple[Tag, Any]]] = {}
        self._puts = 0  #: rows put since the last look (counts shared by threads: approximate)
        self._uses = 0  #: rows used since the last look
        self._wasted = False  #: whether rows were dropped since the last look
        self._paused = 0  #: rows still to read without keeping them
        self._resumed = False  #: whether the last look paused (the next needs no drop to)

    def current(self) -> Tag:
        """The tag the rows kept now are under."""
        return self._version, self._epoch

    def observe(self, version: object, touches: int | None) -> tuple[bool, Tag]:
        """Record the counters a search read; (whether the rows kept before still hold, the tag
        its rows go under). A count that could not be read (None) holds nothing."""
        with self._lock:
            held = touches is not None and version == self._version and touches <= self._touches
            if not held:
                self._drop()
                self._version = version
                self._touches = max(touches if touches is not None else -1, self._touches)
            return held, (self._version, self._epoch)

    def reinforced(self, tiers: Iterable[str], nids: Iterable[str], at: float, count: int) -> None:
        """This process reinforced ``nids`` at ``at`` and the namespace's count came back as
        ``count``: the rows say so, unless another process reinforced notes since the last
        count known (then they are dropped)."""
        with self._lock:
            if count > self._touches + 1 and self._touches >= 0:
                self._drop()
            else:
                stamp = repr(at)
                for tier in tiers:
                    rows = self._tiers.get(tier, {})
                    for nid in nids:
                        row = rows.get(nid)
                        if row is not None:
                            rows[nid] = (row[0], {**row[1], "last_access": stamp})
            self._touches = max(self._touches, count)

    def _drop(self) -> None:
        self._epoch += 1
        self._wasted = self._wasted or any(self._tiers.values())
        self._tiers = {}

    def get_many(self, tier: str, nids: Iterable[str], tag: Tag) -> dict[str, Any]:
        """The rows of those of ``nids`` kept in ``tier`` under ``tag``, by id."""
        rows = self._tiers.get(tier, {})
        got = {nid: row[1] for nid in nids if (row := rows.get(nid)) is not None and row[0] == tag}
        self._uses += len(got)
        return got

    def put(self, tier: str, nid: str, tag: Tag, value: Any) -> None:
        if self._paused:
            self._paused -= 1
            return
        rows = self._tiers.setdefault(tier, {})
        if len(rows) >= MAX_ROWS:
            with self._lock:  # one thread drops; a row another puts meanwhile stays
                for old in list(islice(rows, MAX_ROWS // 10)):
                    rows.pop(old, None)
                self._wasted = True
        rows[nid] = (tag, value)
        self._puts += 1
        if self._puts >= CHECK_ROWS:
            self._look()

    def _look(self) -> None:
        with self._lock:
            resumed, self._resumed = self._resumed, False
            if (self._wasted or resumed) and self._uses * MIN_USES < self._puts:
                self._drop()
                self._paused = PAUSE_ROWS
                self._resumed = True
            self._puts = self._uses = 0
            self._wasted = False


@dataclass(frozen=True)
class Pinned:
    """One search's view of a RowCache: the tag its first round trip read (rows of others are
    not used), or no cache at all (``cache`` None: every row is read from Redis)."""

    cache: RowCache | None
    tag: Tag = (None, -1)

    def get_many(self, tier: str, nids: Iterable[str]) -> dict[str, Any]:
        return {} if self.cache is None else self.cache.get_many(tier, nids, self.tag)

    def put(self, tier: str, nid: str, value: Any) -> None:
        if self.cache is not None:
            self.cache.put(tier, nid, self.tag, value)
