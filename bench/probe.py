"""What one heartbeat probe costs: the command the Kubernetes pods of deploy/k8s/ run,
``zettelq health --role worker --host HOST``, timed end to end (wall) and by the CPU its process
used (user + system, from the children's rusage), while a real `zettelq worker` beats.

Run from the repo root: ``.venv/bin/python bench/probe.py`` (about a minute). It starts its own
redis-server (worker.runtime.devserver) and one worker with a fresh key prefix; ``--runs`` probes
after ``--warmup`` untimed ones, one after another. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from worker.runtime.devserver import EmbeddedRedis


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    probe = [str(bin_dir / "zettelq"), "health", "--role", "worker", "--host", socket.gethostname()]
    with EmbeddedRedis() as redis:
        env = dict(os.environ, ZQ_REDIS_URL=redis.url, ZQ_KEY_PREFIX=f"b{uuid.uuid4().hex[:8]}")
        env["ZQ_INDEX_DIR"] = f"/tmp/zettelq-probe-{os.getpid()}"
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while subprocess.run(probe, env=env, capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    raise SystemExit("the worker never beat")
                time.sleep(0.5)
            for _ in range(args.warmup):
                subprocess.run(probe, env=env, capture_output=True, check=True)
            walls, cpus = [], []
            for _ in range(args.runs):
                cpu, start = child_cpu_s(), time.perf_counter()
                subprocess.run(probe, env=env, capture_output=True, check=True)
                walls.append(time.perf_counter() - start)
                cpus.append(child_cpu_s() - cpu)
        finally:
            worker.terminate()
            worker.wait(30)
    print(
        json.dumps(
            {
                "runs": args.runs,
                "wall_s": {"p50": statistics.median(walls), "max": max(walls)},
                "cpu_s": {"p50": statistics.median(cpus), "max": max(cpus)},
                "load": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
