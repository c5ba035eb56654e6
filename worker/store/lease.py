"""Leases in Redis: a key holding a random token with a TTL, renewed while work goes on.

Used for the shard lease (one drain per shard) and the namespace lock (one mutator per
namespace). A holder that dies simply stops renewing; the lease expires and work moves on.
A holder that is only slow (a large batch on a loaded host) keeps its lease with ``kept()``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.connection import Connection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    RedisError,
    TryAgainError,
    WatchError,
)

from worker.bulk import BulkTransaction, Commands, node_of
from worker.errors import LeaseLost, SlotMoving

log = logging.getLogger(__name__)

RELEASE_LUA = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
RENEW_LUA = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
#: ``kept()`` stops renewing after this many TTLs, so a holder stuck for good (not just slow)
#: still lets its lease expire and the work move to another worker.
MAX_KEPT_TTLS = 30


class Lease:
    """``with Lease(r, key, ttl_s).wait(timeout_s):`` or ``if lease.acquire(): ...``."""

    def __init__(self, r: Redis | RedisCluster, key: str, ttl_s: float, owner: str = "") -> None:
        self.r = r
        self.key = key
        self.ttl_ms = int(ttl_s * 1000)
        #: unique per acquisition; starts with ``owner/`` so an operator can see who holds it
        self.token = f"{owner}/{os.urandom(12).hex()}".encode()
        self.held = False
        #: held by renewals and by a fenced commit, so a renewal (which touches the key)
        #: never lands between the commit's WATCH and its EXEC
        self._renewing = threading.RLock()

    def queue_acquire(self, pipe: Pipeline) -> None:
        """Queue an acquisition in the caller's pipeline; pass its reply to ``acquired``."""
        pipe.execute_command("SET", self.key, self.token, "NX", "PX", self.ttl_ms)

    def acquired(self, reply: object) -> bool:
        """Whether the reply of a queued acquisition took the lease (and record it)."""
        self.held = reply is not None and reply is not False
        return self.held

    def acquire(self) -> bool:
        self.held = bool(self.r.set(self.key, self.token, nx=True, px=self.ttl_ms))
        return self.held

    def wait(self, timeout_s: float) -> Lease:
        """Acquire, retrying every few ms until ``timeout_s``; raise LeaseLost if it never frees."""
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while not self.acquire():
            if time.monotonic() > deadline:
                raise LeaseLost(f"{self.key} stayed held for {timeout_s:.1f}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self

    def renew(self) -> None:
        with self._renewing:
            self.renewed(self.r.eval(RENEW_LUA, 1, self.key, self.token, self.ttl_ms))

    def queue_renew(self, pipe: Pipeline) -> None:
        """Queue a renewal in the caller's pipeline; pass its reply to ``renewed``."""
        pipe.execute_command("EVAL", RENEW_LUA, 1, self.key, self.token, self.ttl_ms)

    def renewed(self, reply: object) -> None:
        """Check the reply of a renewal: LeaseLost (and no longer held) when the lease is gone."""
        if not reply:
            self.held = False
            raise LeaseLost(f"lost {self.key}")

    @contextmanager
    def kept(self) -> Iterator[Lease]:
        """Renew the lease from a background thread every third of its TTL while the block
        runs (at most MAX_KEPT_TTLS TTLs), so one slow step cannot outlive it. A renewal that
        finds the lease gone stops; the fenced commit then refuses the holder's writes."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self._keep, args=(stop,), name=f"zq-lease:{self.key}", daemon=True
        )
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def _keep(self, stop: threading.Event) -> None:
        interval_s = self.ttl_ms / 3000
        give_up = time.monotonic() + MAX_KEPT_TTLS * self.ttl_ms / 1000
        while not stop.wait(interval_s) and time.monotonic() < give_up:
            try:
                with self._renewing:
                    if not self.r.eval(RENEW_LUA, 1, self.key, self.token, self.ttl_ms):
                        return
            except RedisError as exc:
                log.warning("could not renew %s (%s); retrying", self.key, exc)

    @contextmanager
    def fenced(self) -> Iterator[Pipeline]:
        """A MULTI/EXEC pipeline whose EXEC only applies while this lease is still ours. One
        round trip WATCHes the lease and reads it (LeaseLost if it is no longer ours); the
        transaction then renews it as its last command. A holder whose lease expired or was
        taken after that read cannot commit over the worker that took it over: the WATCH
        aborts the EXEC, which raises LeaseLost. ``execute()`` returns the raw replies of the
        caller's commands (see BulkTransaction).

        On a Redis Cluster the transaction runs on the node of the lease's slot, which every
        key it writes shares (the namespace's hash tag). When that slot moved or is migrating,
        nothing is applied: SlotMoving, after the client has relearnt the cluster's layout."""
        with (
            self._renewing,
            _moving(self.r),
            _RenewingTransaction(node_of(self.r, self.key), self.key, self.ttl_ms) as pipe,
        ):
            if pipe.watch_get(self.key) != self.token:
                self.held = False
                raise LeaseLost(f"lost {self.key}")
            pipe.multi()
            try:
                yield pipe
            except WatchError as exc:
                self.held = False
                raise LeaseLost(f"lost {self.key} while committing") from exc

    def release(self, pipe: Pipeline | None = None) -> None:
        """Release the lease; with ``pipe``, in the same round trip as the commands already
        queued there (the pipeline is executed, even when the lease is no longer held)."""
        if pipe is None:
            pipe = self.r.pipeline(transaction=False)
        if self.held:
            pipe.execute_command("EVAL", RELEASE_LUA, 1, self.key, self.token)
        pipe.execute()
        self.held = False

    def __enter__(self) -> Lease:
        if not self.held:
            self.wait(self.ttl_ms / 1000)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@contextmanager
def _moving(r: Redis | RedisCluster) -> Iterator[None]:
    """Turn a cluster's redirection of a transaction (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) into
    SlotMoving, refreshing the client's map of slots first."""
    try:
        yield
    except (AskError, TryAgainError, ClusterDownError) as exc:
        log.info("a commit met a moving cluster slot (%s); it is retried", exc)
        if isinstance(r, RedisCluster):
            r.nodes_manager.initialize()
        raise SlotMoving(f"{exc}; retrying where the slot now is") from exc


class _RenewingTransaction(BulkTransaction):
    """A fenced commit's transaction: renews the lease (PEXPIRE) after the caller's commands,
    inside the same EXEC, and returns only the caller's replies."""

    def __init__(self, r: Redis, key: str, ttl_ms: int) -> None:
        super().__init__(r)
        self._renewal: tuple[tuple[Any, ...], Any] = (("PEXPIRE", key, ttl_ms), {})

    def _execute_transaction(
        self, connection: Connection, commands: Commands, raise_on_error: bool
    ) -> list[Any]:
        replies = super()._execute_transaction(
            connection, [*commands, self._renewal], raise_on_error
        )
        return replies[:-1]
