"""Drain a shard stream in batches through the consumer group, under the shard lease.

Entries are XACKed and deleted only after their batch is committed, so a worker killed
mid-batch loses nothing: the next drain of the shard (once the dead worker's lease expires)
claims the entries it left pending and applies them before any later entry. Together with the
entry id each note records (worker/intake/ingest.py), the state of an id is the effect of its last
job in stream order, whatever was redelivered, reclaimed or retried. A job that cannot be decoded or
applied goes to the dead-letter stream with its reason; its batch-mates carry on.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from producer import validation
from producer.errors import InvalidInput, ProtocolError
from producer.protocol import (
    PROTOCOL_VERSION,
    DeleteJob,
    JobHead,
    RestoreJob,
    StoreJob,
    unpack,
    unpack_raw,
    validate,
)
from worker import metrics, tracing
from worker.context import WorkerContext
from worker.errors import TRANSIENT, LeaseLost, SignatureRejected
from worker.index.changelog import stream_pos
from worker.intake import restore
from worker.intake.deadletter import ORIGIN_FIELD
from worker.intake.dispatch import GROUP, kick
from worker.intake.ingest import Entry, Job, handle_jobs
from worker.intake.signing import check_signature
from worker.store import notes
from worker.store.lease import Lease

log = logging.getLogger(__name__)

#: a drain hands its shard over after this long when another shard's drain waits for a worker,
#: so other shards get a turn; when none waits it keeps the shard (and its warm projection)
SLICE_S = 5.0

RawEntry = tuple[bytes, dict[bytes, bytes]]
Fetched = tuple[list[RawEntry], int]  #: entries read, and the group's pending count after


@dataclass(frozen=True)
class DrainResult:
    processed: int
    more: bool  #: the shard still has entries; drain it again
    handover: int | None = None  #: the waiting shard this worker should drain next


def drain_shard(ctx: WorkerContext, shard: int, *, wait_ms: int | None = None) -> DrainResult:
    """Organise what shard ``shard`` holds; return at once if another worker drains it."""
    lease = Lease(ctx.redis, ctx.keys.lease(shard), ctx.settings.lease_s, owner=ctx.consumer)
    if not lease.acquire():
        return DrainResult(0, more=False)
    counter = [0]
    try:
        ctx.redis.set(ctx.keys.drainer(shard), ctx.consumer)
        ensure_group(ctx, shard)
        handover = _drain_batches(ctx, shard, lease, counter, wait_ms)
    except LeaseLost as exc:
        log.warning("shard=%d handed over after %d jobs: %s", shard, counter[0], exc)
        return DrainResult(counter[0], more=True)
    finally:
        lease.release()
    more = handover is not None or backlog(ctx, shard) > 0
    return DrainResult(counter[0], more, handover)


def _drain_batches(
    ctx: WorkerContext, shard: int, lease: Lease, counter: list[int], wait_ms: int | None
) -> int | None:
    """Process batches until the shard is empty (None) or, once a batch ends its time slice,
    another shard waits for a worker (that shard); ``counter[0]`` counts the jobs processed so
    far, even when a LeaseLost ends the drain. A batch is acknowledged in the same round trip
    that renews the lease and reads the next."""
    with lease.kept():
        done = _process(ctx, shard, _earliest(ctx, shard))
    counter[0] += len(done)
    started = time.monotonic()
    wait = ctx.settings.batch_wait_ms if wait_ms is None else wait_ms
    while True:
        batch = _read(ctx, shard, wait, _ack_and_read(ctx, shard, lease, done, read=True))
        if not batch:
            return None
        with lease.kept():
            done = _process(ctx, shard, batch)
        counter[0] += len(done)
        if time.monotonic() - started > SLICE_S:
            handover = next_shard(ctx, shard)
            if handover is not None:
                _ack_and_read(ctx, shard, lease, done, read=False)
                return handover
            started = time.monotonic()


def _ack_and_read(
    ctx: WorkerContext, shard: int, lease: Lease, done: list[bytes], *, read: bool
) -> Fetched:
    """One round trip: acknowledge and delete the committed entries ``done``, renew the shard
    lease (LeaseLost if it is gone) and, with ``read``, take up to batch_size new entries without
    waiting and count the group's pending entries after that. Entries read along with a lost
    lease stay pending for this consumer; the next holder of the shard applies them first."""
    key = ctx.keys.inbox(shard)
    pipe = ctx.redis.pipeline(transaction=False)
    if done:
        pipe.xack(key, GROUP, *done)
        pipe.xdel(key, *done)
        pipe.hincrby(ctx.keys.shard_counters(shard), "jobs", len(done))
    lease.queue_renew(pipe)
    if not read:
        lease.renewed(pipe.execute()[-1])
        return [], 0
    pipe.xreadgroup(GROUP, ctx.consumer, {key: ">"}, count=ctx.settings.batch_size)
    pipe.xpending(key, GROUP)
    *_, renewal, got, pending = pipe.execute()
    lease.renewed(renewal)
    return (list(got[0][1]) if got else []), int(pending["pending"])


def next_shard(ctx: WorkerContext, shard: int) -> int | None:
    """The shard a drain of ``shard`` should hand over to: one whose drain is queued and not yet
    taken by any worker (its kick flag is set and nobody holds its lease), so every worker is
    busy; None when there is none. Of those, the one this process drained last (its projections
    of that shard's namespaces need no catch-up) wins unless another has waited a whole slice
    longer, so with more shards than workers each worker keeps to the same shards in turn
    instead of catching up every namespace the others organised."""
    others = [s for s in range(ctx.keys.shard_count) if s != shard]
    pipe = ctx.redis.pipeline(transaction=False)
    for other in others:
        pipe.pttl(ctx.keys.kicked(other))
        pipe.exists(ctx.keys.lease(other))
        pipe.get(ctx.keys.drainer(other))
    replies = pipe.execute()
    flag_ms, me = ctx.settings.lease_s * 1000, ctx.consumer.encode()
    best: tuple[float, int] | None = None
    for i, other in enumerate(others):
        pttl, leased, drainer = replies[3 * i : 3 * i + 3]
        if pttl == -2 or leased:  # no drain queued, or a worker has it
            continue
        waited_s = max(flag_ms - pttl, 0) / 1000 if pttl > 0 else 0.0
        score = waited_s + (SLICE_S if drainer == me else 0.0)
        if best is None or score > best[0]:
            best = (score, other)
    return None if best is None else best[1]


def backlog(ctx: WorkerContext, shard: int) -> int:
    """Entries in the shard stream not yet committed (committed ones are deleted)."""
    return int(ctx.redis.xlen(ctx.keys.inbox(shard)))


def ensure_group(ctx: WorkerContext, shard: int) -> None:
    try:
        ctx.redis.xgroup_create(ctx.keys.inbox(shard), GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _earliest(ctx: WorkerContext, shard: int) -> list[RawEntry]:
    """The earliest batch_size entries pending in the shard's group, whoever read them, claimed
    for this consumer. Every pending entry precedes every entry not yet read, so applying these
    first keeps stream order: a previous holder's stranded entries go before any later one. The
    drain holds the shard lease, so their reader has lost it; should it still commit them, the
    namespace lock's fence refuses it or the notes' entry ids make the later copy a no-op."""
    key = ctx.keys.inbox(shard)
    _, claimed, deleted = ctx.redis.xautoclaim(
        key, GROUP, ctx.consumer, min_idle_time=0, start_id="0-0", count=ctx.settings.batch_size
    )
    if deleted:
        ctx.redis.xack(key, GROUP, *deleted)
    if claimed:
        log.warning("shard=%d applies %d entries left pending first", shard, len(claimed))
        metrics.count_reclaimed(len(claimed))
    return [e for e in claimed if e[1]]


def _read(ctx: WorkerContext, shard: int, wait_ms: int, first: Fetched) -> list[RawEntry]:
    """The next batch: ``first`` (a read that did not wait) topped up to batch_size, waiting up
    to ``wait_ms`` to fill it (an empty first read returns at once); or, when the group holds
    pending entries besides these (read by a previous holder of the shard, even after it lost
    the lease), the earliest pending entries instead."""
    entries, pending = first
    key, size = ctx.keys.inbox(shard), ctx.settings.batch_size
    deadline = time.monotonic() + wait_ms / 1000
    while entries and len(entries) < size:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            break
        pipe = ctx.redis.pipeline(transaction=False)
        pipe.xreadgroup(
            GROUP, ctx.consumer, {key: ">"}, count=size - len(entries), block=remaining_ms
        )
        pipe.xpending(key, GROUP)
        got, summary = pipe.execute()
        pending = int(summary["pending"])
        if not got:
            break
        entries += got[0][1]
    return _earliest(ctx, shard) if pending > len(entries) else entries


def _process(ctx: WorkerContext, shard: int, batch: list[RawEntry]) -> list[bytes]:
    """Apply a batch; returns its entry ids, committed or dead-lettered, for acknowledging."""
    started = time.perf_counter()
    payloads = {origin(raw_id, fields): fields.get(b"j", b"") for raw_id, fields in batch}
    accepted = _accepted(ctx, shard, batch)
    parents = [job.tp for entries in accepted.values() for _, job in entries]
    with tracing.batch_span(shard, len(batch), parents):
        for ns, entries in accepted.items():
            _handle_isolated(ctx, shard, ns, entries, payloads)
    if batch:
        held = lambda: sum(len(p.ids) for p in ctx.held_projections().values())  # noqa: E731
        metrics.observe_batch(time.perf_counter() - started, len(batch), held, ctx.embedder.dim)
    return [raw_id for raw_id, _ in batch]


def _accepted(ctx: WorkerContext, shard: int, batch: list[RawEntry]) -> dict[str, list[Entry]]:
    """The batch's jobs by namespace, in order; the rest are dead-lettered with their reason."""
    by_ns: dict[str, list[Entry]] = defaultdict(list)
    for raw_id, fields in batch:
        entry_id = origin(raw_id, fields)
        payload = fields.get(b"j", b"")
        try:
            job = decode_job(ctx, fields)
        except (ProtocolError, InvalidInput) as exc:
            dead_letter(ctx, shard, entry_id, payload, str(exc), _peek_ns(payload))
            continue
        try:
            check_signature(ctx.settings, payload, [job.ns])
        except SignatureRejected as exc:
            _refuse(ctx, shard, entry_id, payload, job, str(exc))
            continue
        by_ns[job.ns].append((entry_id, job))
    return by_ns


def _refuse(
    ctx: WorkerContext,
    shard: int,
    entry_id: str,
    payload: bytes,
    job: Job,
    reason: str,
) -> None:
    """Dead-letter a job that failed its signature check and audit the refusal in its namespace."""
    dead_letter(ctx, shard, entry_id, payload, reason, job.ns)
    pipe = ctx.redis.pipeline(transaction=False)
    notes.audit(
        pipe,
        ctx.keys,
        job.ns,
        f"refused-{job.op}",
        job.id,
        actor=job.agent or "unknown",
        source=f"inbox:{entry_id}",
        after={"reason": reason},
    )
    pipe.execute()


def _handle_isolated(
    ctx: WorkerContext, shard: int, ns: str, entries: list[Entry], payloads: dict[str, bytes]
) -> None:
    """Handle the namespace's jobs together; if that fails, one by one, dead-lettering failures
    with their payload as queued, so ``zettelq dead retry`` can replay them."""
    try:
        handle_jobs(ctx, ns, entries)
        return
    except TRANSIENT:
        raise  # transient, or not the jobs' fault: keep them queued and retry the drain
    except Exception:
        log.exception("batch of ns=%s failed; retrying its %d jobs one by one", ns, len(entries))
    for entry in entries:
        try:
            handle_jobs(ctx, ns, [entry])
        except TRANSIENT:
            raise
        except Exception as exc:
            log.exception("job entry=%s of ns=%s failed", entry[0], ns)
            dead_letter(ctx, shard, entry[0], payloads[entry[0]], f"failed: {exc!r}", ns)


def origin(raw_id: bytes, fields: dict[bytes, bytes]) -> str:
    """The entry id a job is judged by: its own, or for a job re-queued from the dead-letter
    stream the one it had when first queued (so a retry keeps its place in stream order). An
    origin that is not an entry id before the job's own is ignored: it can only make a job
    older (a no-op where a later job was applied), never newer than its place in the stream."""
    own = raw_id.decode()
    first = fields.get(ORIGIN_FIELD.encode())
    try:
        claimed = first.decode() if first is not None else own
        return claimed if stream_pos(claimed) < stream_pos(own) else own
    except (UnicodeDecodeError, ValueError):
        return own


def decode_job(ctx: WorkerContext, fields: dict[bytes, bytes]) -> Job:
    """Unpack and re-validate a job against this worker's limits."""
    payload = fields.get(b"j")
    if payload is None:
        raise ProtocolError("entry has no 'j' field")
    raw = unpack_raw(payload)
    head = validate(JobHead, raw)
    if head.v != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {head.v}; this worker speaks {PROTOCOL_VERSION}")
    job: Job
    if head.op == "store":
        job = validate(StoreJob, raw)
    elif head.op == "restore":
        return restore.check_restore(validate(RestoreJob, raw), ctx.settings)
    else:
        job = validate(DeleteJob, raw)
    validation.check_namespace(job.ns)
    validation.check_id(job.id)
    validation.check_agent(job.agent)
    validation.check_time(job.created_at, "created_at")
    if isinstance(job, StoreJob):
        s = ctx.settings
        validation.check_text(job.content, "content", s.max_content_bytes)
        validation.check_metadata(job.metadata, s.max_metadata_bytes)
        validation.check_tags(job.tags, s.max_tags, s.max_tag_chars)
        validation.check_time(job.event_time, "event_time")
        validation.check_unit_float(job.importance, "importance")
    return job


def _peek_ns(payload: bytes) -> str:
    """The namespace a broken job names, when it names a valid one (for its stats)."""
    try:
        ns = unpack(JobHead, payload).ns
        return validation.check_namespace(ns)
    except (ProtocolError, InvalidInput):
        return ""


def dead_letter(
    ctx: WorkerContext, shard: int, entry_id: str, payload: bytes, reason: str, ns: str = ""
) -> None:
    """Record a job that cannot be applied; it never blocks its shard again."""
    log.warning("dead-lettered entry=%s shard=%d: %s", entry_id, shard, reason)
    metrics.count_dead_letter()
    record: dict[Any, Any] = {
        "payload": payload,
        "reason": reason,
        "entry": entry_id,
        "shard": shard,
        "ns": ns,
        "ts": repr(time.time()),
    }
    pipe = ctx.redis.pipeline(transaction=False)
    pipe.xadd(ctx.keys.dead(), record, maxlen=ctx.settings.dead_max, approximate=True)
    if ns:
        pipe.hincrby(ctx.keys.stats(ns), "dead", 1)
    pipe.execute()


def run_drain(ctx: WorkerContext, shard: int, send: Callable[[int], None]) -> int:
    """The drain task: clear the kick flag and drain; queue another drain if work remains and no
    other worker has taken the shard meanwhile. A drain that hands its shard over goes on with
    the shard it handed over to, in this task."""
    processed = 0
    next_: int | None = shard
    while next_ is not None:
        ctx.redis.delete(ctx.keys.kicked(next_))
        result = drain_shard(ctx, next_)
        processed += result.processed
        if result.more:
            kick(ctx.redis, ctx.keys, next_, ctx.settings.lease_s, send)
        next_ = result.handover
    return processed
