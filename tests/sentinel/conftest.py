"""Real Sentinel setups on loopback: one master and one replica
(``redis-server --replicaof``) and three sentinels (``redis-server sentinel.conf --sentinel``)
on free ports from 18500 up, with a short down-after (1 s) so a failover takes seconds, the
sentinels asking for a password of their own (ZQ_SENTINEL_PASSWORD); torn down at the end.
The tests that kill no server share one setup; a test that kills the master starts its own.
Skips, naming what to install, when redis-server is not on PATH."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis import Redis

from tests.conftest import make_settings
from worker.runtime.devserver import free_ports
from worker.settings import WorkerSettings

FIRST_PORT = 18500
SERVICE = "zqmaster"
SENTINELS = 3
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
READY_S = 30.0
SENTINEL_PASSWORD = "sentinel-secret"  #: the sentinels' requirepass (the master has none)


SENTINEL_ENV = {"ZQ_SENTINEL_PASSWORD": SENTINEL_PASSWORD}  #: what worker_env() leaves out


@dataclass
class LocalSentinel:
    """One Sentinel setup: the master's, the replica's and the sentinels' ports, and every
    process by its port."""

    master_port: int
    replica_port: int
    sentinels: list[int]
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/{db}"

    def sentinel(self, port: int) -> Redis:
        return Redis(
            host="127.0.0.1",
            port=port,
            password=SENTINEL_PASSWORD,
            socket_timeout=2,
            decode_responses=True,
        )

    def master_address(self) -> tuple[str, int] | None:
        """Where the sentinels that answer say the master is (None while they disagree)."""
        seen = set()
        for port in self.sentinels:
            try:
                host, master = self.sentinel(port).sentinel_get_master_addr_by_name(SERVICE)
            except Exception:
                continue
            seen.add((host, int(master)))
        return seen.pop() if len(seen) == 1 else None

    def kill(self, port: int) -> None:
        """SIGKILL the server on ``port`` (no shutdown, no last save)."""
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(timeout=10)

    def wait_failover(self, timeout_s: float = READY_S) -> int:
        """The port of the new master, once the sentinels agree it is no longer the killed one
        and it accepts writes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.master_address()
            if found and found[1] != self.master_port:
                try:
                    Redis(host="127.0.0.1", port=found[1], socket_timeout=2).set("zq:probe", 1)
                    return found[1]
                except Exception:
                    pass
            time.sleep(0.1)
        raise RuntimeError("the sentinels did not fail over in time")


def _wait(predicate: Callable[[], object], what: str, timeout_s: float = READY_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _server(port: int, work: Path, *extra: str) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True)
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", ""]
    return subprocess.Popen(
        ["redis-server", *args, "--appendonly", "no", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _sentinel(port: int, master: int, work: Path) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True)
    conf = work / "sentinel.conf"  # a sentinel rewrites its file: one each, writable
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {work}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
        f"requirepass {SENTINEL_PASSWORD}\nsentinel sentinel-pass {SENTINEL_PASSWORD}\n"
    )
    return subprocess.Popen(
        ["redis-server", str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _ready(setup: LocalSentinel) -> bool:
    for port in setup.sentinels:
        s = setup.sentinel(port)
        master = s.sentinel_master(SERVICE)
        if int(master["num-other-sentinels"]) < SENTINELS - 1 or not s.sentinel_slaves(SERVICE):
            return False
    return True


@contextmanager
def started(root: Path) -> Iterator[LocalSentinel]:
    """A master, its replica and three sentinels with their files under ``root``, once the
    sentinels see the master, the replica and each other; stopped on exit (bench/sentinel.py
    uses it too)."""
    master, replica, *sentinels = free_ports(FIRST_PORT, 2 + SENTINELS)
    setup = LocalSentinel(master, replica, sentinels)
    try:
        setup.procs[master] = _server(master, root / str(master))
        _wait(lambda: Redis(port=master).ping(), "the master")
        setup.procs[replica] = _server(
            replica, root / str(replica), "--replicaof", "127.0.0.1", str(master)
        )
        _wait(
            lambda: Redis(port=replica).info("replication")["master_link_status"] == "up",
            "the replica's link",
        )
        for port in sentinels:
            setup.procs[port] = _sentinel(port, master, root / str(port))
        _wait(lambda: _ready(setup), "the sentinels to see the master, replica and each other")
        yield setup
    finally:
        for proc in setup.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a test may have stopped one
                proc.terminate()
        for proc in setup.procs.values():
            proc.wait(timeout=10)


def _setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinel]:
    if not shutil.which("redis-server"):
        pytest.skip("needs redis-server >= 7 on PATH (apt-get install redis-server)")
    with started(tmp_path_factory.mktemp("sentinel")) as setup:
        yield setup


@pytest.fixture(scope="session")
def shared_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinel]:
    """One setup for the tests that kill no server (each under a key prefix of its own): the
    sentinels take ~7 s to see each other, so each test starting its own would add that."""
    yield from _setup(tmp_path_factory)


@pytest.fixture
def local_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinel]:
    """A setup of the test's own, for a test that kills the master."""
    yield from _setup(tmp_path_factory)


def settings_of(setup: LocalSentinel, tmp_path: Path) -> WorkerSettings:
    """Settings whose data store and broker are the Sentinel-watched master (db 0 and 1),
    under a fresh key prefix; a worker process of them needs ``SENTINEL_ENV`` too."""
    return make_settings(
        tmp_path,
        redis_url=setup.url(0),
        broker_url=setup.url(1),
        sentinel_password=SENTINEL_PASSWORD,
        key_prefix=f"s{uuid.uuid4().hex[:8]}",
    )


@pytest.fixture
def sentinel_settings(shared_sentinel: LocalSentinel, tmp_path: Path) -> WorkerSettings:
    """``settings_of`` the shared setup."""
    return settings_of(shared_sentinel, tmp_path)


@pytest.fixture
def failover_settings(local_sentinel: LocalSentinel, tmp_path: Path) -> WorkerSettings:
    """``settings_of`` the test's own setup."""
    return settings_of(local_sentinel, tmp_path)
