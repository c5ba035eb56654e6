"""Foundation benchmark: producer cost, queueing, ingest and search of one real worker process.

Run from the repo root: ``.venv/bin/python bench/foundation.py`` (about 5 minutes for the
default sizes 1,000, 10,000 and 100,000). For each size N, on a dedicated Redis DB (flushed at the
start and end of every size) under a fresh key prefix:

1. raw Redis round trip: LPUSH of a 300 B payload through redis-py;
2. ``MemoryClient.store()`` latency with no worker running (pure producer cost);
3. ``store_many()`` throughput in chunks of 500 until N notes are queued;
4. ingest throughput of one ``zettelq worker`` process (timed from the first organised note, so
   worker start-up is excluded), and the peak RSS of its process tree;
5. search round trip with ``fresh=True`` and ``fresh=False`` against that worker.

Notes are ~200 bytes of sentences drawn from a 3,000-word vocabulary with Zipf frequencies
(the most common English words first, then made-up ones), so that they resemble agent text.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from producer import MemoryClient, ProducerSettings

log = logging.getLogger("bench.foundation")

ROOT = Path(__file__).resolve().parents[1]  #: repo root, the worker's working directory
NAMESPACE = "bench"  #: the one namespace every note goes to
SHARD_COUNT = 8  #: ZQ_SHARD_COUNT of producer and worker
LATENCY_CALLS = 5_000  #: timed calls for the raw round trip and store()
WARMUP_CALLS = 200  #: untimed calls before each latency series
CHUNK = 500  #: notes per store_many() call
WARMUP_SEARCHES = 50  #: untimed searches before each timed series
K = 10  #: hits per search
POLL_S = 0.2  #: stats() polling interval during ingest
RSS_SAMPLE_S = 0.1  #: RSS sampling interval of the worker's process tree
STOP_TIMEOUT_S = 15.0  #: SIGTERM grace before SIGKILL
STALL_S = 120.0  #: give up on ingest when no note is organised for this long
VOCAB_SIZE = 3_000  #: words in the vocabulary
ZIPF_S = 1.07  #: Zipf exponent of word frequencies
NOTE_BYTES = (170, 230)  #: note length range, in characters (ASCII, so bytes)
RAW_PAYLOAD_BYTES = 300  #: payload of the raw LPUSH

COMMON = (
    "the of and to a in is it you that he was for on are with as I his they be at one have "
    "this from or had by not word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round "
    "man year came show every good me give our under name very through just form sentence"
).split()
ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
CODAS = ("", "", "n", "r", "s", "t", "l", "nd", "ck")


class Corpus:
    """Seeded generator of English-ish notes and queries with Zipf word frequencies."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        words = list(dict.fromkeys(COMMON))
        seen = set(words)
        while len(words) < VOCAB_SIZE:
            word = "".join(self._syllable() for _ in range(self.rng.choice((1, 2, 2, 3, 3, 4))))
            if word not in seen:
                seen.add(word)
                words.append(word)
        self.words = words
        self.cum = list(itertools.accumulate(1 / r**ZIPF_S for r in range(1, len(words) + 1)))
        common = len(dict.fromkeys(COMMON))
        self.content = words[common:]
        self.content_cum = [c - self.cum[common - 1] for c in self.cum[common:]]

    def _syllable(self) -> str:
        return self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + self.rng.choice(CODAS)

    def _words(self, k: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self.cum, k=k)

    def note(self) -> str:
        target = self.rng.randint(*NOTE_BYTES)
        sentences: list[str] = []
        size = 0
        while size < target:
            words = self._words(self.rng.randint(6, 16))
            sentence = " ".join(words).capitalize() + self.rng.choice(".....?!")
            sentences.append(sentence)
            size += len(sentence) + 1
        return " ".join(sentences)[:target].rstrip() + "."

    def query(self) -> str:
        """1-2 words drawn from the whole vocabulary and 2-4 from its content words (past the
        common ones), shuffled: a query of stop words alone finds nothing by design."""
        words = self._words(self.rng.randint(1, 2))
        k = self.rng.randint(2, 4)
        words += self.rng.choices(self.content, cum_weights=self.content_cum, k=k)
        self.rng.shuffle(words)
        return " ".join(words)


TOPICS = 500  #: topics of a TopicalCorpus
TOPIC_WORDS = 30  #: content words per topic
TOPIC_SHARE = 0.7  #: share of a topical note's words drawn from its topic's words


class TopicalCorpus(Corpus):
    """Notes about topics: the vocabulary and TOPICS topics of TOPIC_WORDS content words each
    come from ``vocab_seed`` (so every TopicalCorpus of that seed shares them), the draws from
    ``seed``. A note keeps to one topic, TOPIC_SHARE of its words from the topic's words and the
    rest as a ``Corpus`` note's; a query names 2-4 of one topic's words and 1-2 of the whole
    vocabulary. Notes on one topic share words, so their vectors cluster (as a text model's do
    for related notes), where a ``Corpus``'s random words give near-uniform ones."""

    def __init__(self, seed: int, vocab_seed: int = 0) -> None:
        super().__init__(vocab_seed)
        drawn = random.Random(vocab_seed + 1)
        self.topics = [drawn.sample(self.content, TOPIC_WORDS) for _ in range(TOPICS)]
        self.rng = random.Random(seed)
        self._topic = self.topics[0]

    def _words(self, k: int) -> list[str]:
        return [
            self.rng.choice(self._topic) if self.rng.random() < TOPIC_SHARE else word
            for word in super()._words(k)
        ]

    def note(self) -> str:
        self._topic = self.rng.choice(self.topics)
        return super().note()

    def query(self) -> str:
        words = Corpus._words(self, self.rng.randint(1, 2))
        words += self.rng.sample(self.rng.choice(self.topics), self.rng.randint(2, 4))
        self.rng.shuffle(words)
        return " ".join(words)


def corpus_of(kind: str, seed: int) -> Corpus:
    """A ``Corpus`` (``kind`` "words": random words) or a ``TopicalCorpus`` ("topics") drawing
    from ``seed``."""
    if kind == "topics":
        return TopicalCorpus(seed)
    if kind == "words":
        return Corpus(seed)
    raise ValueError(f"no corpus kind {kind!r}; words or topics")


@dataclass(frozen=True)
class Latency:
    p50_us: float
    p99_us: float


@dataclass
class Result:
    n: int
    raw: Latency | None = None
    store: Latency | None = None
    store_many_per_s: float = 0.0
    ingest_per_s: float = 0.0
    ingest_s: float = 0.0
    ingested: int = 0
    startup_s: float = 0.0
    rss_ingest_mib: float = 0.0
    rss_search_mib: float = 0.0
    search: dict[bool, Latency] = field(default_factory=dict)
    repeat: Latency | None = None  #: fresh=True, the timed queries a second time
    #: worker tree CPU ms per search (warm-up included) by phase: fresh=True, False, again
    search_cpu_ms: dict[str, float] = field(default_factory=dict)
    hits: dict[bool, tuple[float, int]] = field(default_factory=dict)  #: mean, how many < K
    load: list[str] = field(default_factory=list)  #: 1-minute load average, start and end


def latency(samples_ns: Sequence[int]) -> Latency:
    """p50 and p99 (nearest rank) of samples in nanoseconds, in microseconds."""
    ordered = sorted(samples_ns)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return Latency(rank(0.50), rank(0.99))


def timed(call: Callable[[int], object], calls: int, warmup: int) -> Latency:
    """Latency of ``call(i)``, each call timed on its own, after ``warmup`` untimed calls."""
    for i in range(warmup):
        call(i)
    samples = []
    for i in range(calls):
        started = time.perf_counter_ns()
        call(warmup + i)
        samples.append(time.perf_counter_ns() - started)
    return latency(samples)


def measure_raw(redis_url: str) -> Latency:
    payload = os.urandom(RAW_PAYLOAD_BYTES)
    with Redis.from_url(redis_url) as r:
        lat = timed(lambda _: r.lpush("bench:raw", payload), LATENCY_CALLS, WARMUP_CALLS)
        r.delete("bench:raw")
    return lat


def measure_store(mem: MemoryClient, corpus: Corpus) -> Latency:
    """store() latency; the stored jobs are then dropped so no worker ever sees them."""
    notes = [corpus.note() for _ in range(WARMUP_CALLS + LATENCY_CALLS)]
    lat = timed(lambda i: mem.store(notes[i], namespace=NAMESPACE), LATENCY_CALLS, WARMUP_CALLS)
    with Redis.from_url(mem.settings.redis_url) as r:
        r.delete(mem.keys.inbox(mem.keys.shard_of(NAMESPACE)))
    return lat


def queue_notes(mem: MemoryClient, notes: list[str]) -> float:
    """Queue every note with store_many() in chunks; return notes per second."""
    started = time.perf_counter()
    for i in range(0, len(notes), CHUNK):
        mem.store_many(notes[i : i + CHUNK], namespace=NAMESPACE)
    return len(notes) / (time.perf_counter() - started)


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants, from the PPid of every /proc/<pid>/stat (this kernel has
    no /proc/<pid>/task/<tid>/children)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants, from /proc."""
    total = 0
    for pid in process_tree(root):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended between the scan and the read
        total += int(stat[11]) + int(stat[12])
    return total / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass  # the process ended between the scan and the read
    return 0


class RssSampler:
    """A thread that records the peak summed RSS of a process tree; ``take()`` reads and
    resets the peak, so each phase gets its own."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        total = sum(rss_kib(pid) for pid in process_tree(self.root))
        self.peak_kib = max(self.peak_kib, total)

    def take(self) -> float:
        self.sample()
        peak, self.peak_kib = self.peak_kib, 0
        return peak / 1024

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def worker_env(redis_url: str, prefix: str, index_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZQ_")}
    env.update(
        {
            "ZQ_REDIS_URL": redis_url,
            "ZQ_KEY_PREFIX": prefix,
            "ZQ_INDEX_DIR": index_dir,
            "ZQ_SHARD_COUNT": str(SHARD_COUNT),
        }
    )
    return env


def start_worker(
    env: dict[str, str], log_path: Path, loglevel: str = "WARNING"
) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", "worker", f"--loglevel={loglevel}"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Celery's warm shutdown), SIGKILL after the grace; then any orphaned child."""
    tree = process_tree(proc.pid)[1:]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("worker pid=%d ignored SIGTERM for %.0fs; SIGKILL", proc.pid, STOP_TIMEOUT_S)
        proc.kill()
        proc.wait()
    for pid in tree:
        if rss_kib(pid):
            log.warning("killing leftover worker child pid=%d", pid)
            os.kill(pid, signal.SIGKILL)


def wait_ingested(
    mem: MemoryClient,
    proc: subprocess.Popen[bytes],
    n: int,
    result: Result,
    at_first: Callable[[], object] | None = None,
) -> None:
    """Poll stats() until all ``n`` notes are organised; fill the ingest fields of result.
    ``at_first`` is called when the first organised notes are seen, where the rate starts."""
    started = last_change = time.monotonic()
    first_at: float | None = None
    first_notes = last_notes = 0
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with status {proc.returncode}")
        stats = mem.stats(NAMESPACE)
        now = time.monotonic()
        if stats.notes and first_at is None:
            first_at, first_notes = now, stats.notes
            if at_first is not None:
                at_first()
        if stats.pending + stats.notes < n:  # entries are deleted only after their commit
            lost = n - stats.pending - stats.notes
            raise RuntimeError(f"{lost} jobs vanished (dead={stats.dead}); was the DB flushed?")
        if stats.notes != last_notes:
            last_change, last_notes = now, stats.notes
        if (stats.pending == 0 and stats.notes >= n) or now - last_change > STALL_S:
            break
        time.sleep(POLL_S)
    result.ingested = stats.notes
    result.startup_s = (first_at or now) - started
    if first_at is None or now <= first_at:  # all done before the second poll
        first_at, first_notes = started, 0
    result.ingest_s = now - first_at
    result.ingest_per_s = (stats.notes - first_notes) / result.ingest_s
    if stats.notes < n:
        log.warning("ingest stalled: %d of %d notes after %.0fs", stats.notes, n, now - started)


def log_commit_clock(r: Redis, mem: MemoryClient, result: Result) -> None:
    """Cross-check the polled rate with the worker's own timestamps (first note's updated_at
    to the last batch's commit): slightly optimistic, as the first batch is not counted."""
    keys = mem.keys
    first = r.zrange(keys.active(NAMESPACE), 0, 0)
    last = r.hget(keys.stats(NAMESPACE), "last_ingest")
    if not first or last is None:
        return
    began = r.hget(keys.note(NAMESPACE, first[0].decode()), "updated_at")
    if began is None:
        return
    span_s = float(last) - float(began)
    if span_s > 0:
        log.info(
            "commit clock: %.2fs from first note to last commit, ~%.0f notes/s",
            span_s,
            result.ingested / span_s,
        )


def measure_search(mem: MemoryClient, queries: list[str], fresh: bool) -> tuple[Latency, list[int]]:
    """Latency of the timed searches and how many hits each of them returned."""
    counts: list[int] = []

    def call(i: int) -> None:
        hits = mem.search(queries[i % len(queries)], namespace=NAMESPACE, k=K, fresh=fresh)
        if i >= WARMUP_SEARCHES:
            counts.append(len(hits))

    return timed(call, len(queries) - WARMUP_SEARCHES, WARMUP_SEARCHES), counts


def run_worker_phases(
    mem: MemoryClient,
    n: int,
    searches: int,
    corpus: Corpus,
    result: Result,
    workdir: Path,
    extra_env: dict[str, str],
) -> None:
    s = mem.settings
    env = {**worker_env(s.redis_url, s.key_prefix, str(workdir / "index")), **extra_env}
    # Each mode draws queries of its own, so the second is not timed on caches the first warmed.
    queries = {
        fresh: [corpus.query() for _ in range(WARMUP_SEARCHES + searches)]
        for fresh in (True, False)
    }
    proc = start_worker(env, workdir / "worker.log")
    sampler = RssSampler(proc.pid).start()
    try:
        wait_ingested(mem, proc, n, result)
        result.rss_ingest_mib = sampler.take()
        log.info(
            "ingested %d notes in %.2fs after %.2fs start-up: %.0f notes/s",
            result.ingested,
            result.ingest_s,
            result.startup_s,
            result.ingest_per_s,
        )
        with Redis.from_url(s.redis_url) as r:
            log_commit_clock(r, mem, result)
        if result.ingested < n:
            return
        for fresh in (True, False):
            cpu = cpu_s(proc.pid)
            result.search[fresh], counts = measure_search(mem, queries[fresh], fresh)
            result.search_cpu_ms[str(fresh)] = cpu_ms_per(proc.pid, cpu, len(queries[fresh]))
            result.hits[fresh] = (sum(counts) / len(counts), sum(c < K for c in counts))
            log.info(
                "search fresh=%s: p50 %.2fms p99 %.2fms",
                fresh,
                result.search[fresh].p50_us / 1000,
                result.search[fresh].p99_us / 1000,
            )
        cpu = cpu_s(proc.pid)
        result.repeat, _ = measure_search(mem, queries[True], True)
        result.search_cpu_ms["again"] = cpu_ms_per(proc.pid, cpu, len(queries[True]))
        log.info("search fresh=True again: p50 %.2fms", result.repeat.p50_us / 1000)
        result.rss_search_mib = sampler.take()
    finally:
        sampler.stop()
        stop_worker(proc)
        tail = (workdir / "worker.log").read_text(errors="replace")[-2000:]
        if tail.strip():
            log.info("worker log tail:\n%s", tail)


def cpu_ms_per(pid: int, since_s: float, count: int) -> float:
    """The worker tree's CPU milliseconds per search since ``since_s`` of its CPU seconds."""
    return (cpu_s(pid) - since_s) * 1000 / count


def bench_size(redis_url: str, n: int, searches: int, extra_env: dict[str, str]) -> Result:
    result = Result(n, load=[loadavg()])
    corpus = Corpus(seed=n)
    prefix = f"zqb{os.getpid()}x{n}"
    settings = ProducerSettings(redis_url=redis_url, key_prefix=prefix, shard_count=SHARD_COUNT)
    with MemoryClient(settings) as mem, tempfile.TemporaryDirectory(prefix="zqbench") as tmp:
        result.raw = measure_raw(redis_url)
        log.info("N=%d raw LPUSH: p50 %.1fus p99 %.1fus", n, result.raw.p50_us, result.raw.p99_us)
        result.store = measure_store(mem, corpus)
        log.info("store(): p50 %.1fus p99 %.1fus", result.store.p50_us, result.store.p99_us)
        notes = [corpus.note() for _ in range(n)]
        log.info("notes: mean %.0f bytes", sum(len(t.encode()) for t in notes) / n)
        result.store_many_per_s = queue_notes(mem, notes)
        log.info("store_many: %.0f notes/s", result.store_many_per_s)
        run_worker_phases(mem, n, searches, corpus, result, Path(tmp), extra_env)
    result.load.append(loadavg())
    return result


def loadavg() -> str:
    """The 1-minute load average: this 2-core host is shared, so it qualifies the numbers."""
    return Path("/proc/loadavg").read_text().split()[0]


def flush(redis_url: str) -> None:
    with Redis.from_url(redis_url) as r:
        r.flushdb()


def fmt_us(lat: Latency | None) -> str:
    return f"{lat.p50_us:.0f} µs / {lat.p99_us:.0f} µs" if lat else "not measured"


def fmt_ms(lat: Latency | None) -> str:
    return f"{lat.p50_us / 1000:.2f} ms / {lat.p99_us / 1000:.2f} ms" if lat else "not measured"


def fmt_hits(r: Result) -> str:
    parts = [
        f"mean {mean:.1f}, {short} under {K}"
        for mean, short in (r.hits[fresh] for fresh in (True, False) if fresh in r.hits)
    ]
    return " / ".join(parts) or "not measured"


def table(r: Result) -> str:
    ratio = f" ({r.store.p50_us / r.raw.p50_us:.2f}x raw p50)" if r.store and r.raw else ""
    rows = [
        ("raw Redis round trip (LPUSH 300 B), p50 / p99", fmt_us(r.raw)),
        ("`store()` producer latency, p50 / p99", fmt_us(r.store) + ratio),
        (f"`store_many()` in chunks of {CHUNK}", f"{r.store_many_per_s:,.0f} notes/s"),
        (
            "ingest, 1 worker process",
            f"{r.ingest_per_s:,.0f} notes/s ({r.ingested:,} notes in {r.ingest_s:.1f} s "
            f"after {r.startup_s:.1f} s start-up)",
        ),
        ("`search()` fresh=True, p50 / p99", fmt_ms(r.search.get(True))),
        ("`search()` fresh=False, p50 / p99", fmt_ms(r.search.get(False))),
        ("`search()` fresh=True, the same queries again, p50 / p99", fmt_ms(r.repeat)),
        (f"hits per timed search (k={K}), fresh=True / False", fmt_hits(r)),
        (
            "worker tree CPU per search, fresh=True / False / again (warm-up included)",
            " / ".join(f"{ms:.2f} ms" for ms in r.search_cpu_ms.values()) or "not measured",
        ),
        (
            "worker tree peak RSS, ingest / search",
            f"{r.rss_ingest_mib:.0f} / {r.rss_search_mib:.0f} MiB",
        ),
    ]
    rows.append(("1-min load average, start / end of this size", " / ".join(r.load)))
    lines = [f"### N = {r.n:,}", "", "| measure | result |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines) + "\n"


def verdict(ok: bool | None) -> str:
    return "NOT MEASURED" if ok is None else ("PASS" if ok else "FAIL")


def summary(r: Result) -> list[str]:
    out = []
    if r.store and r.raw:
        ok = r.store.p50_us <= 3 * r.raw.p50_us
        out.append(
            f"- N={r.n:,} store() p50 ≤ 3x raw round trip: {r.store.p50_us:.0f} µs vs "
            f"{3 * r.raw.p50_us:.0f} µs → {verdict(ok)}"
        )
        ok = r.store.p99_us <= 500
        out.append(f"- N={r.n:,} store() p99 ≤ 0.5 ms: {r.store.p99_us:.0f} µs → {verdict(ok)}")
    ok_ingest = r.ingested == r.n and r.ingest_per_s >= 2000
    out.append(
        f"- N={r.n:,} ingest ≥ 2,000 notes/s: {r.ingest_per_s:,.0f} notes/s → {verdict(ok_ingest)}"
    )
    for fresh in (True, False):
        lat = r.search.get(fresh)
        met = None if lat is None else lat.p50_us <= 3000 and lat.p99_us <= 10_000
        scope = "" if r.n == 100_000 else " (target is stated at 100k)"
        out.append(
            f"- N={r.n:,} search fresh={fresh} p50 ≤ 3 ms and p99 ≤ 10 ms{scope}: "
            f"{fmt_ms(lat)} → {verdict(met)}"
        )
    return out + round_trip_targets(r)


#: the search round trip targets of the speed issue at 1k and 100k notes: p50 in ms and as a
#: multiple of the raw LPUSH p50 measured in the same run, and p99 in ms (fresh=True)
ROUND_TRIP_TARGETS = {1_000: (0.6, 10.0, 3.0), 100_000: (1.0, 15.0, 3.0)}
INGEST_TARGET = (100_000, 4_000.0)  #: notes/s of one worker process at that size


def round_trip_targets(r: Result) -> list[str]:
    out = []
    target = ROUND_TRIP_TARGETS.get(r.n)
    for lat, which in ((r.search.get(True), ""), (r.repeat, ", the same queries again")):
        if target is None or r.raw is None:
            break
        p50_ms, ratio, p99_ms = target
        met = None
        if lat is not None:
            p50 = lat.p50_us / 1000
            met = (
                p50 <= p50_ms and lat.p50_us <= ratio * r.raw.p50_us and lat.p99_us <= p99_ms * 1000
            )
        out.append(
            f"- N={r.n:,} search fresh=True{which} p50 ≤ {p50_ms} ms and ≤ {ratio:.0f}x raw "
            f"({ratio * r.raw.p50_us / 1000:.2f} ms), p99 ≤ {p99_ms} ms: {fmt_ms(lat)} "
            f"→ {verdict(met)}"
        )
    if r.n == INGEST_TARGET[0]:
        ok = r.ingested == r.n and r.ingest_per_s >= INGEST_TARGET[1]
        out.append(
            f"- N={r.n:,} ingest ≥ {INGEST_TARGET[1]:,.0f} notes/s: "
            f"{r.ingest_per_s:,.0f} notes/s → {verdict(ok)}"
        )
    return out


def code_version() -> str:
    """HEAD and how many tracked files differ from it: other work may be uncommitted."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = [line for line in git("status", "--porcelain").splitlines() if line[:2] != "??"]
    return f"{head}, {len(changed)} tracked files modified" if changed else head


def zq_setting(item: str) -> tuple[str, str]:
    """An ``--env`` argument: ``ZQ_NAME=VALUE`` as (name, value)."""
    name, sep, value = item.partition("=")
    if not name.startswith("ZQ_") or not sep:
        raise argparse.ArgumentTypeError(f"{item!r} is not ZQ_NAME=VALUE")
    return name, value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="comma-separated note counts")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/12", help="flushed DB")
    p.add_argument("--searches", type=int, default=1000, help="timed searches per mode")
    p.add_argument("--output", type=Path, help="also write the markdown here")
    p.add_argument(
        "--env", action="append", default=[], type=zq_setting, help="ZQ_NAME=VALUE for the worker"
    )
    args = p.parse_args(argv)
    args.env = dict(args.env)
    args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) < 1 or args.searches < 1:
        p.error("sizes and --searches must be positive")
    if Redis.from_url(args.redis_url).connection_pool.connection_kwargs.get("db", 0) == 0:
        p.error("refusing to flush Redis DB 0; name a dedicated DB in --redis-url")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    args = parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    version = code_version()
    log.info("code %s; worker environment beyond the bench's own: %s", version, args.env or "none")
    results = []
    for n in args.sizes:
        flush(args.redis_url)
        try:
            results.append(bench_size(args.redis_url, n, args.searches, args.env))
        finally:
            flush(args.redis_url)
    markdown = (
        f"Run started {started}; code {version}; worker environment beyond the bench's own: "
        f"{' '.join(f'{k}={v}' for k, v in args.env.items()) or 'none'}.\n\n"
        + "\n".join(table(r) for r in results)
        + "\n"
        + "\n".join(line for r in results for line in summary(r))
        + "\n"
    )
    publish(markdown, args.output)
    return 0


def publish(markdown: str, output: Path | None) -> None:
    """Print a run's markdown, and write it to ``output`` when given."""
    sys.stdout.write("\n" + markdown)
    if output:
        output.write_text(markdown)


if __name__ == "__main__":
    sys.exit(main())
