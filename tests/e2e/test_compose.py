"""The healthchecks of deploy/compose.yaml, run for real (Docker images cannot be pulled here):
against a Redis with a password, given only in ZQ_REDIS_URL as deploy/.env would give it, each
service's own command runs here (`zettelq worker`, `searcher`, `beat`, and Flower's shell line),
its healthcheck passes while it runs and fails once it has stopped, and Flower reaches the
workers' broker with that password."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compose import environment, healthcheck_argv, interpolate, services
from tests.conftest import make_settings
from tests.e2e.workers import stop, wait_until, worker_env
from worker.runtime.devserver import EmbeddedRedis, free_port
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

PASSWORD = "s3cret"
COMPOSE_FLOWER_PORT = "5555"  #: the port compose.yaml gives Flower; the test takes a free one
STARTUP_S = 120.0


@pytest.fixture
def stack_settings(tmp_path: Path) -> Iterator[WorkerSettings]:
    with EmbeddedRedis(requirepass=PASSWORD) as server:
        yield make_settings(tmp_path, redis_url=server.url)


def on_port(argv: list[str], port: str) -> list[str]:
    return [part.replace(COMPOSE_FLOWER_PORT, port) for part in argv]


class Stack:
    """The compose services as processes here, each in the environment its container gets."""

    def __init__(self, settings: WorkerSettings, flower_port: str) -> None:
        self.shell = {"ZQ_REDIS_URL": settings.redis_url}  # what deploy/.env would hold
        self.base = {
            **worker_env(settings),  # the rest of the settings, as env_file gives them
            "HOSTNAME": socket.gethostname(),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "FLOWER_UNAUTHENTICATED_API": "true",  # so the test can ask Flower for its workers
        }
        self.flower_port = flower_port

    def env(self, service: str) -> dict[str, str]:
        return {**self.base, **environment(service, self.shell)}

    def start(self, service: str) -> subprocess.Popen[bytes]:
        command = [interpolate(part, self.shell) for part in services()[service]["command"]]
        return subprocess.Popen(
            on_port(command, self.flower_port),
            env=self.env(service),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def healthy(self, service: str) -> bool:
        argv = on_port(healthcheck_argv(service, self.shell), self.flower_port)
        result = subprocess.run(argv, env=self.env(service), capture_output=True, timeout=60)
        return result.returncode == 0


def flower_workers(port: str) -> dict[str, object]:
    url = f"http://127.0.0.1:{port}/api/workers?refresh=1"
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return dict(json.loads(reply.read()))
    except OSError:
        return {}


def test_every_healthcheck_passes_while_its_service_runs_and_fails_once_it_stopped(
    stack_settings: WorkerSettings,
):
    assert PASSWORD in stack_settings.redis_url
    stack = Stack(stack_settings, str(free_port()))
    names = ["worker", "searcher", "beat", "flower"]
    assert not any(stack.healthy(name) for name in names)
    procs = {name: stack.start(name) for name in names}
    try:
        for name in names:
            wait_until(lambda name=name: stack.healthy(name), STARTUP_S)
        wait_until(lambda: flower_workers(stack.flower_port), STARTUP_S)  # via the broker
        for name in names:
            stop(procs[name])
            assert not stack.healthy(name), name
    finally:
        for proc in procs.values():
            stop(proc)
