"""Pipelines for many small commands whose replies the caller decodes itself.

redis-py spends most of a large pipeline's client time packing each command and running each
reply through its response callbacks. These pipelines keep redis-py's command methods (so
callers queue ``pipe.hset(...)``, ``pipe.hmget(...)`` as usual) but pack the whole batch with
hiredis in C and return the raw replies: bytes, ints, None and lists (on RESP2, HGETALL gives
``[field, value, ...]``, which ``fields`` turns into a dict). The replies are taken straight
from the connection's hiredis reader (``_read_all``): a third of a search's candidate read.

On a Redis Cluster a BulkPipeline sends each node the commands of the slots it serves (all
nodes first, then the replies are read) and follows MOVED, ASK and TRYAGAIN replies itself; a
BulkTransaction runs on the node of one slot (``node_of``), which all its keys must share.

A thread that sends many small pipelines (a search thread: two to four a search) can hold one
connection of the pool for them (``pinned``) instead of taking one and giving it back at each
``execute``, which costs redis-py 8 some 6-9 us of locking and bookkeeping each time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hiredis
from redis import Redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _HiredisParser
from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.connection import Connection
from redis.exceptions import AskError, MovedError, ResponseError, TryAgainError, WatchError
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger(__name__)

Commands = list[tuple[tuple[Any, ...], Any]]


#: how often a cluster BulkPipeline resends the commands a node redirected (MOVED, ASK,
#: TRYAGAIN) before ``execute()`` raises the redirection (TRANSIENT for a task): a slot
#: migrating under load settles in far fewer rounds
REDIRECTS = 20
TRYAGAIN_S = 0.01  #: first wait before resending after TRYAGAIN (doubling each time)

_held = threading.local()  #: ``pinned``: this thread's connections, by the id of their pool


def _pinned_conns() -> dict[int, Connection | None]:
    conns: dict[int, Connection | None] | None = getattr(_held, "conns", None)
    if conns is None:
        conns = _held.conns = {}
    return conns


@contextmanager
def pinned(r: Redis | RedisCluster) -> Iterator[None]:
    """Within, this thread's BulkPipelines on ``r`` send over one connection of its pool, taken
    at the first ``execute`` and given back on exit (nothing on a cluster, whose pipelines use a
    connection per node). Each ``execute`` checks it as the pool checks a connection it hands
    out (one Redis closed is opened again); a failed pipeline drops it as it would a pooled one,
    and the next connects again."""
    if isinstance(r, RedisCluster):
        yield
        return
    pool, held = r.connection_pool, _pinned_conns()
    if id(pool) in held:
        yield
        return
    held[id(pool)] = None
    try:
        yield
    finally:
        conn = held.pop(id(pool))
        if conn is not None:
            pool.release(conn)


def node_of(r: Redis | RedisCluster, key: str) -> Redis:
    """The client of the Redis that holds ``key``: ``r`` itself, or on a cluster the client of
    the node serving the key's slot (as the cluster client last learnt it)."""
    if isinstance(r, RedisCluster):
        return r.get_redis_connection(r.get_node_from_key(key))
    return r


class BulkPipeline(Pipeline):  # type: ignore[misc]  # redis-py's Pipeline is untyped
    """A plain (non-transactional) pipeline returning raw replies; raises the first error
    (returns the error replies among the others with ``raise_on_error=False``, on one Redis)."""

    def __init__(self, r: Redis | RedisCluster) -> None:
        self._cluster = r if isinstance(r, RedisCluster) else None
        base = node_of(r, "") if self._cluster is not None else r
        super().__init__(base.connection_pool, base.response_callbacks, False, None)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            if self._cluster is not None:
                return _raise_first(_execute_on_cluster(self._cluster, self.command_stack))
            if not self.command_stack or self.scripts:
                return list(super().execute(raise_on_error))
            return self._execute_plainly(raise_on_error)
        finally:
            self.reset()

    def _execute_plainly(self, raise_on_error: bool) -> list[Any]:
        """``execute()`` on one Redis as redis-py's would (a connection of the pool, or the one
        this thread holds, retried under its retry policy after a connection error, which drops
        the connection), without redis-py's per-call events and metrics: about half of a small
        pipeline's client time."""
        stack, pool, held = self.command_stack, self.connection_pool, _pinned_conns()
        keeps = id(pool) in held
        conn = held.get(id(pool))
        if conn is None:
            conn = pool.get_connection()
            if keeps:
                held[id(pool)] = conn
        else:  # as the pool checks one it hands out: connected, and no reply left unread
            pool.ensure_connection(conn)
        try:
            return conn.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: self._execute_pipeline(conn, stack, raise_on_error),
                lambda _: conn.disconnect(),
            )
        finally:
            if not keeps:
                pool.release(conn)

    def queue(self, *args: Any) -> None:
        """Queue one command given as its arguments (``queue("HMGET", key, *names)``), past
        redis-py's command method: about 1 us less per command, for a search's read loops."""
        self.command_stack.append((args, {}))

    def _execute_pipeline(
        self, connection: Connection, commands: Commands, raise_on_error: bool
    ) -> list[Any]:
        connection.send_packed_command([_pack(commands)])
        replies = _read_all(connection, len(commands))
        return _raise_first(replies) if raise_on_error else replies


def _execute_on_cluster(r: RedisCluster, commands: Commands) -> list[Any]:
    """The raw replies of ``commands`` sent to the nodes of their slots, every node's share in
    one write before any reply is read; commands a node redirects are resent where it says."""
    replies: list[Any] = [None] * len(commands)
    todo = list(range(len(commands)))
    asking: dict[int, str] = {}  #: command -> the node (host:port) an ASK sent it to
    wait_s = TRYAGAIN_S
    for _ in range(REDIRECTS):
        _round_trip(r, commands, _by_node(r, commands, todo, asking), asking, replies)
        todo = [i for i in todo if isinstance(replies[i], AskError | TryAgainError)]
        if not todo:
            break
        log.debug("%d of %d commands redirected; resending", len(todo), len(commands))
        asking = _redirections(r, replies, todo)
        if any(isinstance(replies[i], TryAgainError) for i in todo):
            time.sleep(wait_s)
            wait_s *= 2
    return replies


def _by_node(
    r: RedisCluster, commands: Commands, todo: list[int], asking: dict[int, str]
) -> dict[str, list[int]]:
    """The commands ``todo`` by the node to send them to: where an ASK said, else the node of
    their slot."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for i in todo:
        name = (
            asking.get(i)
            or r.nodes_manager.get_node_from_slot(r.determine_slot(*commands[i][0])).name
        )
        by_node[name].append(i)
    return by_node


def _round_trip(
    r: RedisCluster,
    commands: Commands,
    by_node: dict[str, list[int]],
    asking: dict[int, str],
    replies: list[Any],
) -> None:
    """Write each node its commands, then read every node's replies into ``replies``."""
    sent: list[tuple[Redis, Connection]] = []
    try:
        for name, idx in by_node.items():
            sent.append(_send(r, name, [commands[i] for i in idx], asking, idx))
    except BaseException:
        for client, conn in sent:  # replies left unread: these connections cannot be reused
            conn.disconnect()
            client.connection_pool.release(conn)
        raise
    failed: BaseException | None = None
    for (client, conn), idx in zip(sent, by_node.values(), strict=True):
        try:
            if failed is not None:
                conn.disconnect()  # its replies stay unread: the connection cannot be reused
                continue
            got = iter(_read_all(conn, len(idx) + sum(i in asking for i in idx)))
            for i in idx:
                if i in asking:
                    next(got)  # ASKING's OK
                replies[i] = next(got)
        except BaseException as exc:
            failed = exc
            conn.disconnect()
        finally:
            client.connection_pool.release(conn)
    if failed is not None:
        raise failed


def _redirections(r: RedisCluster, replies: list[Any], todo: list[int]) -> dict[int, str]:
    """Where the ASK replies among ``todo`` send their commands; after a MOVED the client's map
    of slots is relearnt first."""
    if any(isinstance(replies[i], MovedError) for i in todo):
        r.nodes_manager.initialize()
    return {i: f"{replies[i].host}:{replies[i].port}" for i in todo if type(replies[i]) is AskError}


def _send(
    r: RedisCluster, name: str, commands: Commands, asking: dict[int, str], idx: list[int]
) -> tuple[Redis, Connection]:
    """Write ``commands`` (each one an ASK redirected preceded by ASKING) to node ``name``;
    the node's client and the connection to read the replies from."""
    node = r.nodes_manager.get_node(node_name=name)
    if node is None:  # a node the client has not met yet: one joined the cluster
        r.nodes_manager.initialize()
        node = r.nodes_manager.get_node(node_name=name)
    client = r.get_redis_connection(node)
    conn = client.connection_pool.get_connection()
    packed = b"".join(
        (hiredis.pack_command(("ASKING",)) if i in asking else b"") + hiredis.pack_command(args)
        for i, (args, _) in zip(idx, commands, strict=True)
    )
    try:
        conn.send_packed_command([packed])
    except BaseException:
        conn.disconnect()
        client.connection_pool.release(conn)
        raise
    return client, conn


def _pack(commands: Commands) -> bytes:
    return b"".join([hiredis.pack_command(args) for args, _ in commands])


def _read_all(connection: Connection, count: int) -> list[Any]:
    """The next ``count`` replies; error replies are returned, not raised.

    redis-py's ``read_response`` costs ~5 µs of Python per reply around hiredis, which is most
    of a large pipeline's client time; this takes each reply from the connection's hiredis
    reader and reads the socket only when the reader has no whole reply (zettelq's connections
    speak RESP2: no push frames interleave). Any failure drops the connection, as
    ``read_response`` does, since replies may be left unread."""
    parser = connection._parser
    if not isinstance(parser, _HiredisParser):  # a connection class with a parser of its own
        return [_read(connection) for _ in range(count)]
    out: list[Any] = []
    try:
        reader = parser._reader
        if reader is None:  # disconnected meanwhile: read_response raises the same
            return [_read(connection) for _ in range(count)]
        while len(out) < count:
            reply = reader.gets()
            if reply is NOT_ENOUGH_DATA:
                parser.read_from_socket()
                continue
            if isinstance(reply, RedisConnectionError):  # LOADING and the like: as read_response
                raise reply
            out.append(reply)
    except BaseException:
        connection.disconnect()
        raise
    return out


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
        queued = _read_all(connection, len(commands) + 1)
        error = next((r for r in queued if isinstance(r, ResponseError)), None)
        try:
            response = connection.read_response()
        except ResponseError as exc:
            raise error or exc from None
        self.watching = False
        if response is None:
            raise WatchError("Watched variable changed.")
        return _raise_first(list(response))
