"""Errors raised by this package.

ZettelqError
├── InvalidInput        the call's arguments break a documented limit (also a ValueError)
│   └── InvalidSetting  a ZQ_ environment variable (or settings argument) has a bad value
├── Unavailable         Redis could not be reached (connection refused, reset or timed out),
│   │                   or cannot serve now (BUSY with a script, READONLY replica, MISCONF)
│   └── NotReplicated   the write reached the master but not ZQ_WAIT_REPLICAS replicas in time
├── AccessDenied        Redis refused the credentials or an ACL denied the command
├── Backpressure        the pending backlog passed its configured bound; nothing was written
├── OutOfMemory         Redis is at its maxmemory and refused the write (noeviction); nothing
│                       was written
├── ProtocolError       a message could not be packed or unpacked
├── ReplyTimeout        no reply arrived before the deadline (also a TimeoutError)
├── JobFailed           the worker reported a failure (see ``.reason``)
├── NotFound            no active note has that id in that namespace (also a KeyError)
├── Conflict            a proposal's note changed since, or the proposal is in another state
└── ServerError         Redis answered with another error reply (e.g. WRONGTYPE at a key)
"""

from __future__ import annotations


class ZettelqError(Exception):
    """Base class for every error raised by this package."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__)


class InvalidInput(ZettelqError, ValueError):
    """The input breaks a documented limit; nothing was written."""


class InvalidSetting(InvalidInput):
    """A setting has a bad value; the message names its ZQ_ variable and what it expects."""


class Unavailable(ZettelqError):
    """Redis could not be reached, or cannot serve now (busy, read-only, cannot persist); retry
    later."""


class NotReplicated(Unavailable):
    """The write reached the master but fewer than ZQ_WAIT_REPLICAS replicas confirmed it within
    ZQ_WAIT_REPLICAS_TIMEOUT_S, so a failover may lose it. ``ids`` are the notes written; storing
    them again with the same ``id=`` is idempotent."""

    def __init__(self, message: str, ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.ids = ids or []


class AccessDenied(ZettelqError, PermissionError):
    """Redis refused the user or password of ZQ_REDIS_URL, or an ACL rule denied the command."""


class Backpressure(ZettelqError):
    """The pending backlog is over its configured bound; nothing was written, retry later."""


class OutOfMemory(ZettelqError):
    """Redis is at its maxmemory and refused the write (maxmemory-policy noeviction); nothing was
    written. Free memory (ZQ_MAX_NOTES, delete notes) or raise maxmemory, then retry."""


class ProtocolError(ZettelqError):
    """A message could not be packed or unpacked."""


class ReplyTimeout(ZettelqError, TimeoutError):
    """No reply arrived before the deadline (is a worker running?)."""


class JobFailed(ZettelqError):
    """The worker reported a failure."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"job failed: {reason}")
        self.reason = reason


class NotFound(ZettelqError, KeyError):
    """No active note has that id in that namespace."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"


class Conflict(ZettelqError):
    """The proposal cannot take this step: its note changed since (a later write would be
    clobbered) or the proposal is not in the state the step needs; nothing was written."""


class ServerError(ZettelqError):
    """Redis answered with an error reply that none of the other errors names (the message
    quotes it), e.g. WRONGTYPE when a key zettelq uses holds a value of another type."""
