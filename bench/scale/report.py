"""The million-note bench's markdown report, with the issue's goals checked."""

from __future__ import annotations

from collections.abc import Callable

from bench.foundation import (
    Latency,
    fmt_ms,
    loadavg,
)
from bench.scale.state import (
    GROWTH_GOAL,
    MEMORY_SAMPLE,
    P50_GOAL_MS,
    PROGRESS_S,
    RESTART_QUERIES,
    Checkpoint,
    Run,
    verdict,
)


def fmt_lat(lat: Latency | None) -> str:
    return fmt_ms(lat).replace(" ms / ", " / ")


def checkpoint_table(run: Run) -> list[str]:
    cps = run.checkpoints
    rows: list[tuple[str, Callable[[Checkpoint], str]]] = [
        ("organised notes/s over the stretch", lambda c: f"{c.rate:,.0f} ({c.stretch_s:.0f} s)"),
        ("longest spell with jobs queued and none organised", lambda c: f"{c.stall_s:.1f} s"),
        ("snapshot once drained: save (catch-up, copy and write), size", snapshot_cell),
        ("worker tree peak RSS over the stretch", lambda c: f"{c.rss_mib:,.0f} MiB"),
        (
            "Redis used_memory per note (above the empty server)",
            lambda c: f"{c.used_per_note:,.0f} B",
        ),
        ("search (default channels), p50 / p99", lambda c: fmt_lat(c.search)),
        ("search (dense channel alone), p50 / p99", lambda c: fmt_lat(c.dense)),
        ("raw LPUSH p50 (the base)", lambda c: f"{c.raw.p50_us:.0f} µs" if c.raw else "—"),
        ("search / raw p50, default / dense", ratios),
        (
            "0 lost / 0 duplicated",
            lambda c: "PASS" if not c.integrity else "FAIL: " + "; ".join(c.integrity),
        ),
        ("1-min load average", lambda c: c.load),
    ]
    out = ["| measure | " + " | ".join(f"N = {c.n:,}" for c in cps) + " |"]
    out.append("|---" * (len(cps) + 1) + "|")
    out += [f"| {name} | " + " | ".join(cell(c) for c in cps) + " |" for name, cell in rows]
    return out


def snapshot_cell(c: Checkpoint) -> str:
    return f"{c.snapshot.seconds:.1f} s, {c.snapshot.mib:,.0f} MiB" if c.snapshot else "—"


def ratios(c: Checkpoint) -> str:
    if not (c.raw and c.search and c.dense):
        return "—"
    return f"{c.search.p50_us / c.raw.p50_us:.1f}x / {c.dense.p50_us / c.raw.p50_us:.1f}x"


def memory_table(run: Run) -> list[str]:
    cps = run.checkpoints
    kinds = list(dict.fromkeys(kind for c in cps for kind, _, _ in c.memory))
    out = ["| key kind | " + " | ".join(f"N = {c.n:,}: B/note (keys)" for c in cps) + " |"]
    out.append("|---" * (len(cps) + 1) + "|")
    for kind in kinds:
        cells = []
        for c in cps:
            row = next((r for r in c.memory if r[0] == kind), None)
            cells.append(f"{row[2]:,.1f} ({row[1]:,})" if row else "—")
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    sums = [sum(r[2] for r in c.memory) for c in cps]
    out.append("| sum of MEMORY USAGE | " + " | ".join(f"{s:,.0f}" for s in sums) + " |")
    out.append(
        "| used_memory delta (the sum + allocator and keyspace overhead) | "
        + " | ".join(f"{c.used_per_note:,.0f}" for c in cps)
        + " |"
    )
    return out


def per_million(run: Run) -> str:
    """RSS and Redis memory scaled to a million notes, and the audit stream's share."""
    first, top = run.checkpoints[0], run.checkpoints[-1]
    text = f"At N = {top.n:,}: worker tree peak RSS {top.rss_mib / 1024:,.2f} GiB"
    if top.n > first.n:
        slope = (top.rss_mib - first.rss_mib) / (top.n - first.n) * 1e6 / 1024
        text += f" ({slope:,.2f} GiB per million notes from N = {first.n:,} on)"
    audit = next((b for kind, _, b in top.memory if kind == "audit"), 0.0)
    trimmed = (
        "trimmed to ZQ_AUDIT_MAX entries as the periodic audit job does"
        if run.args.trim_audit
        else "one entry per note; the periodic audit job, not run here, trims it to ZQ_AUDIT_MAX "
        "entries, 100,000 by default"
    )
    return (
        f"{text}; Redis used_memory {top.used_per_note * 1e6 / 2**30:,.2f} GiB per million notes, "
        f"{audit * 1e6 / 2**30:,.2f} GiB of it the audit stream ({trimmed})."
    )


def goals(run: Run) -> None:
    """The issue's goals over the checkpoints, appended to the checks."""
    first, top = run.checkpoints[0], run.checkpoints[-1]
    scope = "" if top.n == 1_000_000 else f" (goal stated at 1M; measured at {top.n:,})"
    for cp in run.checkpoints:
        run.check(
            f"N={cp.n:,}: 0 lost, 0 duplicated",
            not cp.integrity,
            "; ".join(cp.integrity) or "all held",
        )
    if top.search and first.search:
        run.check(
            f"search p50 ≤ {P50_GOAL_MS:.0f} ms at the top size{scope}",
            top.search.p50_us <= P50_GOAL_MS * 1000,
            fmt_ms(top.search),
        )
        growth = top.search.p50_us / first.search.p50_us
        grown = (
            ""
            if (first.n, top.n) == (10_000, 1_000_000)
            else f" (goal 10k → 1M; measured {first.n:,} → {top.n:,})"
        )
        run.check(
            f"search p50 growth ≤ {GROWTH_GOAL:.0f}x{grown}",
            growth <= GROWTH_GOAL,
            f"{growth:.2f}x",
        )
    if "warm answers" in run.facts:
        same = run.facts["warm default same"] and run.facts["warm dense same"]
        run.check(
            f"warm restart answers the {RESTART_QUERIES} queries as before",
            same,
            run.facts["warm answers"],
        )
    if "cold answers" in run.facts:
        run.check(
            f"cold rebuild answers the {RESTART_QUERIES} queries as before (its IVF lists are "
            "trained on another count than the ingest's, so dense answers may differ)",
            None,
            run.facts["cold answers"],
        )


def report(run: Run, started: str, redis_info: dict[str, str]) -> str:
    measured = list(run.checks)
    run.checks.clear()
    goals(run)
    run.checks += measured
    top = run.checkpoints[-1]
    snaps = sorted(run.snapshot_runs.values())
    lines = [
        f"Run started {started}; code {run.facts['code']}; {run.facts['cpus']} CPUs; 1-min load "
        f"{run.facts['load start']} at the start, {loadavg()} at the end; "
        f"total {run.facts['took']}.",
        "",
        f"Redis {redis_info['redis_version']} started by the bench, no RDB and no AOF "
        f"({', '.join(f'{k} {v!r}' for k, v in redis_info.items() if k != 'redis_version')}); "
        f"extra --redis-arg: {' '.join(run.args.redis_arg) or 'none'}. Corpus: "
        f"{run.args.corpus}. Worker environment "
        f"beyond the bench's own: {' '.join(run.args.worker_env) or 'none'}; ZQ_SNAPSHOT_EVERY_S="
        f"{run.args.snapshot_every_s:g}"
        + (
            "; the audit stream trimmed to ZQ_AUDIT_MAX before each memory reading."
            if run.args.trim_audit
            else "."
        ),
        "",
        *checkpoint_table(run),
        "",
        per_million(run),
        "",
        f"Redis memory by key kind (MEMORY USAGE SAMPLES 0; note and links hashes estimated from "
        f"{MEMORY_SAMPLE:,} random ones):",
        "",
        *memory_table(run),
        "",
        "Encodings of the sampled hashes at N = "
        + f"{top.n:,}: "
        + "; ".join(f"{k}: {dict(v)}" for k, v in top.encodings.items())
        + ".",
        "",
        "Ingest rate by N (notes organised, notes/s over the last "
        f"{PROGRESS_S:.0f} s): "
        + (", ".join(f"{n:,}: {r:,.0f}" for n, r in run.rates) or "—")
        + ".",
        f"Snapshot runs seen by the ingest polls: {len(snaps)} saves, longest "
        f"{max(snaps, default=0):.1f} s, total {sum(snaps):.1f} s (the projection's lock is held "
        "for the catch-up and the copy, not for the write).",
        "Index rebuilds logged (worker, kind, from, n, ms): "
        + ("; ".join(" ".join(row) for row in run.facts.get("rebuilds", [])) or "none")
        + ".",
    ]
    for name in ("recall took", "delete took", "evict took", "worker errors"):
        if name in run.facts:
            lines.append(f"{name}: {run.facts[name]}.")
    lines += ["", *(f"- {name}: {value} → {verdict(ok)}" for name, ok, value in run.checks)]
    return "\n".join(lines) + "\n"
