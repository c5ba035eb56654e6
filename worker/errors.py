"""Every exception the worker raises, and TRANSIENT: the failures a task retries.

Errors a user or operator sees extend the client's ``ZettelqError`` (producer/errors.py); the
conditions a worker handles itself extend ``WorkerError``::

    * ZettelqError (producer.errors)
      + EmbeddingError           an embedder could not turn texts into vectors
        - EmbedderUnavailable    unreachable, overloaded or misconfigured: retried (TRANSIENT)
        - EmbeddingRejected      these texts were refused: retrying them cannot help
      + UnsupportedRedis         the Redis server is older than zettelq needs
      + MigrationRefused         a worker holds a shard lease while ``zettelq migrate`` runs
      + ServerNotFound           no Redis-protocol server to start (also a FileNotFoundError)
    * WorkerError
      + LeaseLost                the lease expired or was taken mid-work (TRANSIENT)
      + SlotMoving               a cluster slot moved or is migrating under a commit (TRANSIENT)
      + IndexCorrupt             an index snapshot is missing or unreadable: rebuild from Redis
      + NotFresh                 a namespace was not organised up to a search by its deadline
      + SignatureRejected        a job is not signed with the key of every namespace it names
      + LLMFailure               one chat call gave no usable answer (``reason`` is a counter)
      + JobError                 a job raised while organise() ran it
      + UnknownJob               organise() was asked for a job it does not run (a ValueError)

A message defaults to the class's docstring.
"""

from __future__ import annotations

from redis.exceptions import AskError, ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer.errors import ZettelqError


class EmbeddingError(ZettelqError):
    """An embedder could not turn texts into vectors."""


class EmbedderUnavailable(EmbeddingError):
    """The embedder cannot be reached, is overloaded or misconfigured; the texts are not at fault
    and the work that needed them is retried later."""


class EmbeddingRejected(EmbeddingError):
    """The embedder refused these texts; retrying them unchanged cannot succeed."""


class UnsupportedRedis(ZettelqError):
    """The Redis server is older than zettelq needs."""


class MigrationRefused(ZettelqError):
    """A worker holds a shard lease: migrating under it could lose its writes."""


class ServerNotFound(ZettelqError, FileNotFoundError):
    """No Redis-protocol server at version 7.0 or later is installed."""


class WorkerError(Exception):
    """A condition the worker handles itself (retry, rebuild, reply with an error)."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__)


class LeaseLost(WorkerError):
    """The lease expired or was taken while its holder still worked."""


class SlotMoving(WorkerError):
    """A Redis Cluster slot the commit writes moved, or is migrating, to another node; nothing
    was applied, and the commit is retried once the cluster client learnt where it is."""


class IndexCorrupt(WorkerError):
    """The index snapshot is missing or unreadable; rebuild it from Redis."""


class NotFresh(WorkerError):
    """The namespace was not organised up to the search before its deadline."""


class SignatureRejected(WorkerError):
    """A job is not signed with the key of every namespace it names."""


class LLMFailure(WorkerError):
    """One chat call did not produce a usable answer; ``reason`` is a short counter name."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class JobError(WorkerError):
    """A job raised while organise() ran it."""


class UnknownJob(WorkerError, ValueError):
    """organise() was asked for a job that is not in JOBS."""


#: what a task retries with back-off: Redis away or slow, a lease lost, the embedder
#: unreachable, a cluster slot moving (a redirection, TRYAGAIN, CLUSTERDOWN that got through)
TRANSIENT = (
    RedisConnectionError,
    RedisTimeoutError,
    LeaseLost,
    SlotMoving,
    AskError,
    TryAgainError,
    ClusterDownError,
    EmbedderUnavailable,
)
