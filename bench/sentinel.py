"""What ZQ_WAIT_REPLICAS costs and what it buys, on a master, a replica and three sentinels of
its own on loopback (tests/sentinel/conftest.py: free ports from 18500 up).

Run from the repo root: ``PYTHONPATH=. .venv/bin/python bench/sentinel.py`` (about two minutes).

1. Latency: ``--stores`` store() calls with ZQ_WAIT_REPLICAS=0 and as many with 1 (WAIT 1),
   interleaved in blocks of 100 on one setup, each call timed; p50/p99 of each and their ratio.
2. Loss window: ``--trials`` times, on a fresh setup each, ``--writers`` threads store in a loop;
   the master is SIGKILLed while they run, and once the sentinels have promoted the replica the
   new master's shard streams are read: every id whose store() returned before the kill and
   that the new master lacks was acknowledged and lost. Done without and with WAIT, first with
   the replica keeping up (loopback), then with a replica that falls behind: its link cut
   (SIGSTOP, then CLIENT KILL TYPE replica on the master) ``--lag-ms`` before the kill, so the
   writes of that span reach only the master, as over a slow or broken link.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from redis import Redis

from producer import MemoryClient, ZettelqError
from producer.keys import Keys
from producer.protocol import unpack_raw
from producer.settings import ProducerSettings
from tests.sentinel.conftest import SENTINEL_PASSWORD, LocalSentinel, started

BLOCK = 100  #: stores per block when the two modes are interleaved


def settings_for(setup: LocalSentinel, prefix: str, wait: int) -> ProducerSettings:
    return ProducerSettings(
        redis_url=setup.url(0),
        sentinel_password=SENTINEL_PASSWORD,
        key_prefix=prefix,
        wait_replicas=wait,
        wait_replicas_timeout_s=1.0,
        socket_timeout_s=2.0,
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(setup: LocalSentinel, stores: int) -> dict[str, Any]:
    prefix = f"b{uuid.uuid4().hex[:8]}"
    clients = {wait: MemoryClient(settings_for(setup, prefix, wait)) for wait in (0, 1)}
    timings: dict[int, list[float]] = {0: [], 1: []}
    for client in clients.values():  # connections and the script, untimed
        for _ in range(50):
            client.store("warm-up")
    while len(timings[1]) < stores:
        for wait, client in clients.items():
            for _ in range(BLOCK):
                started_at = time.perf_counter()
                client.store("a note of about sixty bytes, stored to time store() alone")
                timings[wait].append(time.perf_counter() - started_at)
    for client in clients.values():
        client.close()
    result: dict[str, Any] = {}
    for wait, values in timings.items():
        result[f"wait{wait}"] = {
            "n": len(values),
            "p50_ms": round(statistics.median(values) * 1000, 3),
            "p99_ms": round(percentile(values, 0.99) * 1000, 3),
        }
    result["ratio_p50"] = round(result["wait1"]["p50_ms"] / result["wait0"]["p50_ms"], 2)
    result["ratio_p99"] = round(result["wait1"]["p99_ms"] / result["wait0"]["p99_ms"], 2)
    return result


def stored_ids(r: Redis, keys: Keys) -> set[str]:
    """The note ids every shard stream of ``keys`` holds."""
    found = set()
    for shard in range(keys.shard_count):
        for _, fields in r.xrange(keys.inbox(shard)):
            found.add(str(unpack_raw(fields[b"j"])["id"]))
    return found


def trial(root: Path, wait: int, writers: int, lag_s: float) -> dict[str, Any]:
    with started(root) as setup:
        prefix = f"b{uuid.uuid4().hex[:8]}"
        settings = settings_for(setup, prefix, wait)
        acked: list[tuple[float, str]] = []  # (when store() returned, id)
        errors = [0]
        stop = threading.Event()

        def loop() -> None:
            with MemoryClient(settings) as mem:
                while not stop.is_set():
                    try:
                        note = mem.store("a note stored while the master dies")
                        acked.append((time.monotonic(), note))
                    except ZettelqError:
                        errors[0] += 1
                        time.sleep(0.01)

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(writers)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        replica = setup.procs[setup.replica_port]
        if lag_s:
            replica.send_signal(signal.SIGSTOP)
            Redis(host="127.0.0.1", port=setup.master_port).client_kill_filter(_type="replica")
            time.sleep(lag_s)
        killed_at = time.monotonic()
        setup.kill(setup.master_port)
        replica.send_signal(signal.SIGCONT)
        port = setup.wait_failover()
        failover_s = time.monotonic() - killed_at
        stop.set()
        for thread in threads:
            thread.join(30)
        before = {note for when, note in acked if when < killed_at}
        survived = stored_ids(Redis(host="127.0.0.1", port=port), Keys.of(settings))
        lost = before - survived
        rate = sum(1 for when, _ in acked if killed_at - 1.0 <= when < killed_at)
        return {
            "replica_lag_ms": round(lag_s * 1000),
            "acked_before_kill": len(before),
            "lost": len(lost),
            "lost_ms_of_writes": round(len(lost) / rate * 1000, 2) if rate else 0.0,
            "typed_errors": errors[0],
            "failover_s": round(failover_s, 2),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=3000)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--lag-ms", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with started(root / "latency") as setup:
            report: dict[str, Any] = {"latency": latency(setup, args.stores)}
        for wait in (0, 1):
            report[f"loss_wait{wait}"] = [
                trial(root / f"loss{wait}-{lag}-{n}", wait, args.writers, lag / 1000)
                for lag in (0, args.lag_ms)
                for n in range(args.trials)
            ]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
