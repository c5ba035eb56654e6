"""Periodic per-namespace jobs: the registry, the incremental and bounded runs beat asks for,
and ``organise`` (every job now, for one namespace).

A job is a plain function ``<verb>_namespace(ctx, ns) -> int`` that returns the work it did
(notes scored, insights written, notes evicted, ...). JOBS lists them in the order organise()
runs them; a job that is not in JOBS simply never runs.

- Incremental: a run of job J visits a namespace only when it changed after J's last run there
  began: its change log (notes added or removed), an ingest commit (``last_ingest``) or a
  productive run of another job (``changed_<job>``) is newer than ``run_<J>``, or J's last run
  there is older than J's MAX_AGE_S, or J's last run there did any work (``work_<J>`` > 0: it
  may have stopped at its own per-run cap), which is how work it left for later is picked up.
  The ``judge`` job is due wherever its queue holds notes.
- Bounded: at most ``periodic_max_namespaces`` namespaces per run, least recently run first, and
  none after the run's work reached ``periodic_max_work``; the rest stay due and go first next
  time.
- Visible: each namespace's stats hash keeps ``run_<J>`` (start), ``work_<J>`` and ``took_<J>``
  of its last run of J (stats() shows them); the last run as a whole (namespaces visited and
  carried over, work, duration) is kept as JSON in ``Keys.runs`` (``zettelq runs``, an operator
  view: it spans every tenant's namespaces). Both are logged.

Jobs take the namespace lock for their own commits, so they never race ingest or each other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from producer.protocol import JobRun
from worker import metrics
from worker.context import WorkerContext
from worker.errors import TRANSIENT
from worker.organise import audit as audit_log
from worker.organise import consolidation, eviction, evolution, importance, merge, supersession
from worker.organise import judge as llm_judge
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

NamespaceJob = Callable[[WorkerContext, str], int]

#: The periodic per-namespace jobs in the order organise() runs them: what changes the graph
#: first (links rejudged by the LLM, duplicates merged, superseded notes marked, insights
#: written), then evolution of the
#: notes new links reached, then importance over the final graph, then eviction by that fresh
#: importance, then the audit stream's upkeep (erasure of deleted notes' history, trimming).
JOBS: dict[str, NamespaceJob] = {
    "judge": llm_judge.judge_namespace,
    "merge": merge.merge_namespace,
    "supersede": supersession.supersede_namespace,
    "consolidate": consolidation.consolidate_namespace,
    "evolve": evolution.evolve_namespace,
    "importance": importance.importance_namespace,
    "evict": eviction.evict_namespace,
    "audit": audit_log.audit_namespace,
}

#: Jobs that also run on a namespace nobody changed, once their last run is this old (s).
MAX_AGE_S: dict[str, float] = {"importance": importance.MAX_AGE_S}

#: Failures that are not the namespace's fault: the run stops and its task is retried.


class PeriodicRun(BaseModel):
    """The last beat run of a job over the namespaces due for it (kept in ``Keys.runs``)."""

    job: str
    at: float
    seconds: float
    namespaces: int  #: namespaces the run visited
    left: int  #: namespaces due but carried over to the next run (a bound was reached)
    work: int


@dataclass(frozen=True)
class Due:
    """What decides whether a job is due in one namespace."""

    ns: str
    last_run: float  #: start of the job's last run there (0 = never)
    changed: float  #: latest change of the namespace a run of this job has not seen
    #: work the last run did: a productive run looks once more, as it may have stopped at its
    #: own per-run cap (evolution's triggers, supersession's new notes) with work left
    last_work: int = 0


def interval_s(s: WorkerSettings, job: str) -> float:
    """Beat interval of ``job``: its own setting, else periodic_every_s."""
    own = {
        "judge": max(s.judge_max_wait_s, 1.0),
        "importance": s.importance_every_s,
        "consolidate": s.consolidate_every_s,
        "evict": s.evict_every_s,
    }
    return own.get(job, s.periodic_every_s)


def is_due(job: str, state: Due, now: float) -> bool:
    if state.changed > state.last_run or state.last_work > 0:
        return True
    max_age = MAX_AGE_S.get(job)
    return max_age is not None and state.last_run > 0 and now - state.last_run > max_age


def select_due(job: str, states: Sequence[Due], now: float) -> list[str]:
    """The namespaces due for ``job``, least recently run first (then by name)."""
    due = [st for st in states if is_due(job, st, now)]
    return [st.ns for st in sorted(due, key=lambda st: (st.last_run, st.ns))]


def changed_at(job: str, stats: Mapping[bytes, bytes], changelog_tail: bytes | None) -> float:
    """Latest change a run of ``job`` has to look at: the change log's last entry (its id is a
    time in ms), the last ingest commit, and the productive runs of the other jobs."""
    times = [float(stats.get(b"last_ingest", 0.0))]
    if changelog_tail is not None:
        times.append(int(changelog_tail.split(b"-")[0]) / 1000)
    own = f"changed_{job}".encode()
    times += [float(t) for k, t in stats.items() if k.startswith(b"changed_") and k != own]
    return max(times)


def read_due(ctx: WorkerContext, job: str) -> list[Due]:
    """Each namespace's due state for ``job``; for ``judge``, a namespace is due exactly while
    its judge queue holds notes (a partial group waits there for company)."""
    names = sorted(m.decode() for m in ctx.redis.smembers(ctx.keys.namespaces()))
    pipe = ctx.redis.pipeline(transaction=False)
    for ns in names:
        pipe.hgetall(ctx.keys.stats(ns))
        pipe.xrevrange(ctx.keys.changes(ns), count=1)
        pipe.llen(ctx.keys.judge(ns))
    replies = pipe.execute()
    out = []
    now = time.time()
    for i, ns in enumerate(names):
        stats, tail, queued = replies[3 * i : 3 * i + 3]
        last = float(stats.get(f"run_{job}".encode(), 0.0))
        work = int(stats.get(f"work_{job}".encode(), 0))
        if job == "judge":
            out.append(Due(ns, last, now if queued else 0.0))
        else:
            changed = changed_at(job, stats, tail[0][0] if tail else None)
            out.append(Due(ns, last, changed, work))
    return out


def run_job(ctx: WorkerContext, job: str, ns: str) -> JobRun:
    """Run one job over one namespace and record the run in the namespace's stats."""
    at, started = time.time(), time.perf_counter()
    work = JOBS[job](ctx, ns)
    seconds = time.perf_counter() - started
    record: dict[str, float | int] = {f"run_{job}": at, f"work_{job}": work, f"took_{job}": seconds}
    if work:
        record[f"changed_{job}"] = time.time()
    ctx.redis.hset(ctx.keys.stats(ns), mapping=record)
    log.info("job=%s ns=%s work=%d in %.1fms", job, ns, work, seconds * 1000)
    metrics.count_periodic(job, work)
    return JobRun(job=job, at=at, work=work, seconds=seconds)


def run_periodic(ctx: WorkerContext, job: str) -> int:
    """One beat run of ``job``: visit the namespaces due for it, within the bounds; return the
    work done. A namespace whose job fails is logged and stays due."""
    if job not in JOBS:
        log.warning("periodic job %r is not registered in this worker; skipped", job)
        return 0
    s = ctx.settings
    at, started = time.time(), time.perf_counter()
    due = select_due(job, read_due(ctx, job), at)
    visited = work = failed = 0
    for ns in due[: s.periodic_max_namespaces]:
        if s.periodic_max_work and work >= s.periodic_max_work:
            break
        visited += 1
        try:
            work += run_job(ctx, job, ns).work
        except TRANSIENT:
            raise
        except Exception:
            log.exception("job=%s ns=%s failed; it stays due", job, ns)
            failed += 1
    seconds = time.perf_counter() - started
    left = len(due) - visited + failed
    run = PeriodicRun(job=job, at=at, seconds=seconds, namespaces=visited, left=left, work=work)
    record_run(ctx, run)
    return work


def record_run(ctx: WorkerContext, run: PeriodicRun) -> None:
    ctx.redis.hset(ctx.keys.runs(), run.job, run.model_dump_json())
    log.info(
        "periodic job=%s namespaces=%d left=%d work=%d in %.1fms",
        run.job,
        run.namespaces,
        run.left,
        run.work,
        run.seconds * 1000,
    )


def last_runs(ctx: WorkerContext) -> dict[str, PeriodicRun]:
    """The last beat run of each periodic job (and of the snapshots), by job name."""
    raw = ctx.redis.hgetall(ctx.keys.runs())
    return {k.decode(): PeriodicRun.model_validate_json(v) for k, v in sorted(raw.items())}
