"""The worker pod of deploy/k8s/worker.yaml, played by a real `zettelq worker` with the pod's
environment: its probe command passes while it runs; SIGTERM to the main process alone (what the
kubelet sends PID 1) starts the soft shutdown (REMAP_SIGTERM=SIGQUIT), and the worker exits by
itself within the pod's grace period, mid-backlog; a second worker then organises every note
exactly once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from producer import MemoryClient
from tests.e2e.workers import group_members, kill_group, stop, wait_until, worker_env
from tests.k8s import container, one
from worker.context import WorkerContext
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

NAMESPACES = ("pods-a", "pods-b", "pods-c", "pods-d")
PER_NAMESPACE = 5000
SOFT_SHUTDOWN_S = "2"  #: shorter than the manifest's, for the test's time


def pod_env(settings: WorkerSettings) -> dict[str, str]:
    """The worker container's literal variables over the test's own settings (the ConfigMap's
    prefix, shard count and metrics port are the test's business, not the pod's)."""
    spec = container(one("Deployment", "zettelq-worker"))
    env = worker_env(settings)
    env.update({e["name"]: e["value"] for e in spec["env"] if "value" in e})
    env["ZQ_SOFT_SHUTDOWN_S"] = SOFT_SHUTDOWN_S
    env["HOSTNAME"] = socket.gethostname()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return env


def probe(env: dict[str, str]) -> int:
    """The pod's liveness probe command, run as the kubelet runs it."""
    command = container(one("Deployment", "zettelq-worker"))["livenessProbe"]["exec"]["command"]
    return subprocess.run(command, env=env, capture_output=True, timeout=60).returncode


def organised(ctx: WorkerContext) -> int:
    return sum(
        int(ctx.redis.hget(ctx.keys.shard_counters(s), "jobs") or 0)
        for s in range(ctx.keys.shard_count)
    )


def test_sigterm_ends_the_worker_pod_within_its_grace_and_loses_nothing(
    settings: WorkerSettings, ctx: WorkerContext
) -> None:
    deployment = one("Deployment", "zettelq-worker")
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    total = len(NAMESPACES) * PER_NAMESPACE
    env = pod_env(settings)
    assert env["REMAP_SIGTERM"] == "SIGQUIT" and env["ZQ_SERVE_SEARCH"] == "false"
    with MemoryClient(settings) as mem:
        ids = {ns: [] for ns in NAMESPACES}
        for ns in NAMESPACES:
            for start in range(0, PER_NAMESPACE, 500):
                texts = [f"{ns} note {i} on topic {i % 41}" for i in range(start, start + 500)]
                ids[ns] += mem.store_many(texts, namespace=ns)
        pod = subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"],
            env=env,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until(lambda: probe(env) == 0, timeout_s=60)
            wait_until(lambda: organised(ctx) > 0, timeout_s=60)
            pod.send_signal(signal.SIGTERM)  # the main process only, as the kubelet does
            assert pod.wait(timeout=grace) == 0
            wait_until(lambda: not group_members(pod.pid), 10)
        finally:
            kill_group(pod)
        assert organised(ctx) < total, "the SIGTERM must land mid-backlog"
        wait_until(lambda: probe(env) != 0, timeout_s=30)  # its heartbeat lapsed

        survivor = subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"],
            env=worker_env(settings),
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until(lambda: all(mem.stats(ns).pending == 0 for ns in NAMESPACES), 300)
        finally:
            stop(survivor)
        for ns in NAMESPACES:
            assert mem.stats(ns).notes == PER_NAMESPACE
            active = {m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)}
            assert active == set(ids[ns])
            creates = [e for _, e in ctx.redis.xrange(ctx.keys.audit(ns)) if e[b"op"] == b"create"]
            assert len(creates) == PER_NAMESPACE, "each note created exactly once"
            assert check_namespace(ctx, ns) == []
