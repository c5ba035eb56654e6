"""Pipelines for many small commands whose replies the caller decodes itself.

redis-py spends most of a large pipeline's client time packing each command and running each
reply through its response callbacks. These pipelines keep redis-py's command methods (so
callers queue ``pipe.hset(...)``, ``pipe.hmget(...)`` as usual) but pack the whole batch with
hiredis in C and return the raw replies: bytes, ints, None and lists (on RESP2, HGETALL gives
``[field, value, ...]``, which ``fields`` turns into a dict).
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis import Redis
from redis.client import Pipeline
from redis.connection import Connection
from redis.exceptions import ResponseError, WatchError

Commands = list[tuple[tuple[Any, ...], Any]]


class BulkPipeline(Pipeline):  # type: ignore[misc]  # redis-py's Pipeline is untyped
    """A plain (non-transactional) pipeline returning raw replies; raises the first error."""

    def __init__(self, r: Redis) -> None:
        super().__init__(r.connection_pool, r.response_callbacks, False, None)

    def queue(self, *args: Any) -> None:
        """Queue one command given as its arguments (``queue("HMGET", key, *names)``), past
        redis-py's command method: about 1 us less per command, for a search's read loops."""
        self.command_stack.append((args, {}))

    def _execute_pipeline(
        self, connection: Connection, commands: Commands, raise_on_error: bool
    ) -> list[Any]:
        connection.send_packed_command([_pack(commands)])
        return _raise_first([_read(connection) for _ in commands])


def _pack(commands: Commands) -> bytes:
    return b"".join([hiredis.pack_command(args) for args, _ in commands])


def _read(connection: Connection) -> Any:
    """One reply; an error reply is returned (not raised) so the rest are still read."""
    try:
        return connection.read_response()
    except ResponseError as exc:
        return exc


def _raise_first(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply
    return replies


def fields(reply: list[bytes] | dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A raw HGETALL reply as {field: value}: a flat list on RESP2 (zettelq's connections), a map
    on RESP3."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


class BulkTransaction(Pipeline):  # type: ignore[misc]  # redis-py's Pipeline is untyped
    """A MULTI/EXEC pipeline for large write batches (thousands of commands), returning raw
    replies; raises the first command error, and WatchError when a WATCHed key changed."""

    def __init__(self, r: Redis) -> None:
        super().__init__(r.connection_pool, r.response_callbacks, True, None)

    def watch_get(self, key: str) -> Any:
        """WATCH ``key`` and GET it in one round trip; the pipeline keeps the connection (as
        ``watch()`` does) until ``execute()`` or ``reset()``."""
        conn: Connection | None = getattr(self, "connection", None)  # untyped in redis-py
        if conn is None:
            conn = self.connection = self.connection_pool.get_connection()
        try:
            conn.send_packed_command([_pack([(("WATCH", key), {}), (("GET", key), {})])])
            replies = _raise_first([_read(conn), _read(conn)])
        except BaseException:
            conn.disconnect()  # replies may be left unread: the connection cannot be reused
            raise
        self.watching = True
        return replies[1]

    def _execute_transaction(
        self, connection: Connection, commands: Commands, raise_on_error: bool
    ) -> list[Any]:
        multi, exec_ = hiredis.pack_command(("MULTI",)), hiredis.pack_command(("EXEC",))
        connection.send_packed_command([multi + _pack(commands) + exec_])
        queued = [_read(connection) for _ in range(len(commands) + 1)]
        error = next((r for r in queued if isinstance(r, ResponseError)), None)
        try:
            response = connection.read_response()
        except ResponseError as exc:
            raise error or exc from None
        self.watching = False
        if response is None:
            raise WatchError("Watched variable changed.")
        return _raise_first(list(response))
