"""Retrieval quality on LoCoMo, through the real producer and a real worker process.

Each conversation goes into its own namespace, one note per turn ("Speaker: text", plus the
image caption), event_time = the session's date, agent = the speaker, id = the turn's dia_id.
After flush(), every question of categories 1-4 is searched and scored against its evidence
turns: recall@5/10/20 (share of evidence ids in the top k) and hit@10, per category and overall.

    python bench/locomo.py ../shared/data/locomo-dev [--redis-url URL] [--option value ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from redis import Redis

from producer import MemoryClient, ProducerSettings

log = logging.getLogger("bench.locomo")

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (5, 10, 20)
DIA_RE = re.compile(r"^D\d+:\d+$")


def load_conversation(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(turn notes, questions) of one LoCoMo file; evidence ids normalised, invalid ones dropped."""
    data = json.loads(path.read_text())
    conv = data.get("conversation", data)
    notes = []
    for key, turns in conv.items():
        m = re.fullmatch(r"session_(\d+)", key)
        if not m or not isinstance(turns, list):
            continue
        when = parse_date(conv.get(f"{key}_date_time", ""))
        for turn in turns:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [image: {turn['blip_caption']}]"
            notes.append(
                {
                    "id": turn["dia_id"].strip(),
                    "content": text,
                    "agent": turn["speaker"],
                    "event_time": when,
                }
            )
    ids = {n["id"] for n in notes}
    questions = []
    for qa in data["qa"]:
        evidence = {e.strip() for e in qa.get("evidence", []) for e in re.split(r"[;,\s]+", e)}
        evidence = {e for e in evidence if DIA_RE.match(e) and e in ids}
        if qa.get("category") in CATEGORIES and evidence:
            questions.append({"q": qa["question"], "evidence": evidence, "cat": qa["category"]})
    return notes, questions


def parse_date(text: str) -> float | None:
    try:
        return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").timestamp()
    except ValueError:
        return None


def start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


#: Ablation configurations: per-search channel weights (see ZQ_DENSE_WEIGHT and friends).
CONFIGS: dict[str, dict[str, float]] = {
    "default": {},
    "lexical only": {"dense": 0, "lexical": 1, "graph": 0, "feedback": 0},
    "lexical + feedback": {"dense": 0, "lexical": 1, "graph": 0},
    "dense only": {"dense": 1, "lexical": 0, "graph": 0, "feedback": 0},
    "dense + lexical + feedback": {"dense": 0.5, "lexical": 1, "graph": 0},
    "default without graph": {"graph": 0},
    "default without feedback": {"feedback": 0},
}


def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    prefix = f"locomo{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        ZQ_REDIS_URL=args.redis_url,
        ZQ_KEY_PREFIX=prefix,
        ZQ_INDEX_DIR=tempfile.mkdtemp(prefix="zq-locomo-"),
    )
    for item in args.set or []:
        name, _, value = item.partition("=")
        env[f"ZQ_{name.upper()}"] = value
    settings = ProducerSettings(redis_url=args.redis_url, key_prefix=prefix, reply_timeout_s=120)
    configs = {name: CONFIGS[name] for name in args.configs.split(",")} if args.configs else CONFIGS
    worker = start_worker(env)
    try:
        with MemoryClient(settings) as mem:
            datasets, notes_per_s = ingest(mem, sorted(Path(args.data).glob("*.json")))
            return {
                name: evaluate(mem, datasets, weights, args.hops, notes_per_s)
                for name, weights in configs.items()
            }
    finally:
        stop_worker(worker)
        cleanup(args.redis_url, prefix)


def ingest(
    mem: MemoryClient, files: list[Path]
) -> tuple[list[tuple[str, list[dict[str, Any]]]], float]:
    """Store every conversation in its own namespace and wait until organised."""
    datasets = []
    total, elapsed = 0, 0.0
    for path in files:
        notes, questions = load_conversation(path)
        ns = f"locomo-{path.stem}"
        started = time.perf_counter()
        for i in range(0, len(notes), 500):
            mem.store_many(notes[i : i + 500], namespace=ns)
        mem.flush(ns, timeout_s=300)
        elapsed += time.perf_counter() - started
        total += len(notes)
        datasets.append((ns, questions))
        log.info("%s: %d notes, %d questions", path.name, len(notes), len(questions))
    return datasets, total / elapsed if elapsed else 0.0


def evaluate(
    mem: MemoryClient,
    datasets: list[tuple[str, list[dict[str, Any]]]],
    weights: dict[str, float],
    hops: int,
    notes_per_s: float,
) -> dict[str, Any]:
    results: list[tuple[int, set[str], list[str]]] = []
    latencies: list[float] = []
    for ns, questions in datasets:
        for q in questions:
            t0 = time.perf_counter()
            hits = mem.search(q["q"], namespace=ns, k=max(KS), hops=hops, weights=weights or None)
            latencies.append(time.perf_counter() - t0)
            results.append((q["cat"], q["evidence"], [h.id for h in hits]))
    return summarise(results, latencies, notes_per_s)


def cleanup(url: str, prefix: str) -> None:
    r = Redis.from_url(url)
    for key in r.scan_iter(f"{prefix}:*", count=1000):
        r.delete(key)
    r.close()


def summarise(
    results: list[tuple[int, set[str], list[str]]], latencies: list[float], notes_per_s: float
) -> dict[str, Any]:
    by_cat: dict[str, list[tuple[set[str], list[str]]]] = defaultdict(list)
    for cat, evidence, ranked in results:
        by_cat[CATEGORIES[cat]].append((evidence, ranked))
        by_cat["overall"].append((evidence, ranked))
    table = {name: metrics(rows) for name, rows in by_cat.items()}
    lat = sorted(latencies)
    return {
        "table": table,
        "ingest_notes_per_s": round(notes_per_s, 1),
        "search_p50_ms": round(1000 * lat[len(lat) // 2], 2),
        "search_p95_ms": round(1000 * lat[int(len(lat) * 0.95)], 2),
    }


def metrics(rows: list[tuple[set[str], list[str]]]) -> dict[str, float]:
    out: dict[str, float] = {"n": len(rows)}
    for k in KS:
        out[f"recall@{k}"] = sum(len(ev & set(r[:k])) / len(ev) for ev, r in rows) / len(rows)
    out["hit@10"] = sum(bool(ev & set(r[:10])) for ev, r in rows) / len(rows)
    return {key: round(v, 3) for key, v in out.items()}


def render_all(summaries: dict[str, dict[str, Any]]) -> str:
    """One table per configuration, then the ablation summary (recall@10 overall / multi-hop)."""
    parts = [f"### {name}\n\n{render(summary)}\n" for name, summary in summaries.items()]
    lines = [
        "| configuration | recall@10 overall | recall@10 multi-hop | hit@10 overall |",
        "|---|---|---|---|",
    ]
    for name, summary in summaries.items():
        table = summary["table"]
        lines.append(
            f"| {name} | {table['overall']['recall@10']} | "
            f"{table.get('multi-hop', {}).get('recall@10', '-')} | "
            f"{table['overall']['hit@10']} |"
        )
    return "\n".join(parts) + "\n### ablation\n\n" + "\n".join(lines)


def render(summary: dict[str, Any]) -> str:
    cols = ["n", *[f"recall@{k}" for k in KS], "hit@10"]
    lines = ["| category | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    order = [*CATEGORIES.values(), "overall"]
    for name in order:
        row = summary["table"].get(name)
        if row:
            lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in cols) + " |")
    lines.append("")
    lines.append(
        f"ingest {summary['ingest_notes_per_s']} notes/s; search p50 "
        f"{summary['search_p50_ms']} ms, p95 {summary['search_p95_ms']} ms"
    )
    return "\n".join(lines)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="directory of LoCoMo conversation JSON files")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    p.add_argument("--hops", type=int, default=1)
    p.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="a worker setting for this run, e.g. --set embedder=hash",
    )
    p.add_argument("--configs", help=f"comma-separated subset of: {', '.join(CONFIGS)}")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = p.parse_args()
    summaries = run(args)
    sys.stdout.write((json.dumps(summaries) if args.json else render_all(summaries)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
