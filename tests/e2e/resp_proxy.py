"""A TCP proxy in front of a real Redis-protocol server that makes it look like an older Redis
in INFO (another redis_version, no valkey_ fields): the server zettelq refuses, without an old
Redis binary to run."""

from __future__ import annotations

import re
import socket
import threading
from types import TracebackType

from worker.runtime.devserver import free_port

CHUNK = 65536  #: bytes read from a socket at a time
VERSION_LINE = re.compile(rb"redis_version:[^\r\n]*")
VALKEY_LINES = re.compile(rb"(?:valkey_\w+|server_name):[^\r\n]*\r\n")  #: what Valkey adds


LINES = frozenset(b"+-:_,#(")  #: RESP2/3 types whose value is the rest of the line
BLOBS = frozenset(b"$=!")  #: types followed by that many bytes (bulk and verbatim strings)
AGGREGATES = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2}  #: items per counted element


def reply_end(buf: bytes, pos: int) -> int | None:
    """Where the RESP2 or RESP3 reply starting at ``pos`` ends, or None while ``buf`` holds only
    part of it."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind, head, end = buf[pos], buf[pos + 1 : line_end], line_end + 2
    if kind in LINES:
        return end
    if kind in BLOBS:
        size = int(head)
        end += size + 2 if size >= 0 else 0
        return end if len(buf) >= end else None
    for _ in range(max(int(head), 0) * AGGREGATES[kind]):
        if (next_end := reply_end(buf, end)) is None:
            return None
        end = next_end
    return end


def rewrite(reply: bytes, version: bytes) -> bytes:
    """The reply, with redis_version set to ``version`` (and Valkey's fields gone) when it is an
    INFO string."""
    if reply[0] not in BLOBS or VERSION_LINE.search(reply) is None:
        return reply
    body = VERSION_LINE.sub(b"redis_version:" + version, reply[reply.index(b"\r\n") + 2 : -2])
    body = VALKEY_LINES.sub(b"", body)
    return b"%c%d\r\n%s\r\n" % (reply[0], len(body), body)


class VersionProxy:
    """Listens on a free loopback port; every connection is relayed to ``upstream_port``, and
    each INFO reply coming back says ``redis_version:<version>`` and nothing of Valkey."""

    def __init__(self, upstream_port: int, version: str) -> None:
        self.upstream_port = upstream_port
        self.version = version.encode()
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._open: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> VersionProxy:
        self._start(self._accept)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sock in [self._listener, *self._open]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected (the listener), or closed by its peer already
            sock.close()
        for thread in self._threads:
            thread.join(5)

    def _start(self, target, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the proxy is closing
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._open += [client, upstream]
            self._start(self._requests, client, upstream)
            self._start(self._replies, upstream, client)

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(CHUNK):
                upstream.sendall(data)
        except OSError:
            pass  # either side went away: the other half notices too
        finally:
            _hang_up(upstream)

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        buf = b""
        try:
            while data := upstream.recv(CHUNK):
                buf += data
                while (end := reply_end(buf, 0)) is not None:
                    client.sendall(rewrite(buf[:end], self.version))
                    buf = buf[end:]
        except OSError:
            pass
        finally:
            _hang_up(client)


def _hang_up(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
