"""A real 3-master Redis Cluster on loopback for the session: three ``redis-server
--cluster-enabled yes`` on free ports from 17000 up, joined by ``redis-cli --cluster create``,
torn down at the end. The tests' data store is the cluster; the broker and anything else that
must be a plain Redis stay on the session's single server (tests/conftest.py)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis import Redis

from tests.conftest import make_settings, session_redis_url
from worker.settings import WorkerSettings

FIRST_PORT = 17000
MASTERS = 3
READY_S = 30.0


@dataclass
class LocalCluster:
    ports: list[int]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node(self, port: int) -> Redis:
        return Redis(host="127.0.0.1", port=port)

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", *args], check=True, capture_output=True, text=True, timeout=120
        )
        return out.stdout


def _free(port: int) -> bool:
    """Whether redis-server can listen on ``port`` and on its cluster bus, ``port`` + 10000
    (with SO_REUSEADDR, as it does: a port a previous run left in TIME_WAIT is free)."""
    for candidate in (port, port + 10000):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def _ports() -> list[int]:
    ports: list[int] = []
    port = FIRST_PORT
    while len(ports) < MASTERS and port < FIRST_PORT + 500:
        if _free(port):
            ports.append(port)
        port += 1
    return ports


def _wait_ok(ports: list[int]) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        try:
            if all(
                b"cluster_state:ok"
                in Redis(host="127.0.0.1", port=p).execute_command("CLUSTER", "INFO")
                for p in ports
            ):
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the cluster on {ports} did not reach cluster_state:ok")


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.skip("needs redis-server and redis-cli >= 7 on PATH (apt-get install redis-server)")
    ports = _ports()
    root: Path = tmp_path_factory.mktemp("cluster")
    procs = []
    for port in ports:
        work = root / str(port)
        work.mkdir()
        procs.append(
            subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(work / "nodes.conf"),
                    "--cluster-node-timeout",
                    "5000",
                    "--dir",
                    str(work),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        for port in ports:
            deadline = time.monotonic() + READY_S
            while True:
                try:
                    Redis(host="127.0.0.1", port=port).ping()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        cluster = LocalCluster(ports)
        cluster.cli(
            "--cluster",
            "create",
            *(f"127.0.0.1:{p}" for p in ports),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        )
        _wait_ok(ports)
        yield cluster
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


@pytest.fixture
def cluster_settings(local_cluster: LocalCluster, tmp_path: Path) -> WorkerSettings:
    """Settings whose data store is the cluster (under a fresh key prefix) and whose broker is
    the session's plain Redis."""
    return make_settings(
        tmp_path,
        redis_url=local_cluster.url,
        broker_url=session_redis_url(),
        key_prefix=f"c{uuid.uuid4().hex[:8]}",
    )
