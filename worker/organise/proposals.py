"""The worker side of evolution proposals: drafts written as proposal records (the review side
is ``producer.proposals``, which documents the record).

``commit_drafts`` runs under the namespace lock, which every worker that reads and rewrites
notes holds (ingest, consolidation, importance, reembed), and re-reads each draft's note first:
a note no longer active, written since its draft was read (version, updated_at or an evolved
field differs) or with a pending proposal already is skipped and counted ``evolve_stale``. The
rest are written in one fenced MULTI/EXEC with their audit entries: applied at once in "apply"
mode (the note's fields, version + 1 and updated_at; audit "evolve"), pending in "propose" mode
(audit "evolve-propose"; ``Keys.proposed`` remembers the note's pending proposal). A record
lists the tags it adds (``added``), which a reject or revert adds to ``Keys.refused``.

``expire_settled`` deletes settled records (applied, rejected, reverted) once they are older
than ``proposal_retention_days``, under the namespace lock, so a review never meets a record
half gone: an applied change can be reverted until then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.client import Pipeline

from producer.proposals import decode_value
from producer.protocol import new_id
from worker.context import WorkerContext
from worker.store import notes
from worker.store.lease import Lease

EVOLVED = ("tags", "context")  #: the note fields evolution may change
SETTLED = ("applied", "rejected", "reverted")  #: statuses no review moves a proposal out of
MAX_EXPIRED_PER_RUN = 1_000  #: most records of each settled status one expiry deletes
SNAPSHOT = (*EVOLVED, "version", "updated_at")  #: raw values a proposal records before/after

Raw = dict[str, bytes | None]  #: note fields as HMGET returns them


@dataclass(frozen=True)
class Draft:
    """A change to propose: the note, its SNAPSHOT values as read, the new field values."""

    note: str
    raw: Raw
    after: dict[str, Any]
    source: str
    reason: str
    triggers: tuple[str, ...]
    batch: tuple[str, ...]


def commit_drafts(
    ctx: WorkerContext, ns: str, drafts: list[Draft], cursor: bytes, mode: str
) -> int:
    """Under the namespace lock, write the drafts whose notes are unchanged and advance the
    audit cursor (``Keys.evolved``) to ``cursor`` in the same transaction; return how many
    were written."""
    keys = ctx.keys
    if not drafts:
        ctx.redis.set(keys.evolved(ns), cursor)
        return 0
    with (
        Lease(ctx.redis, keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer) as lease,
        lease.kept(),
    ):
        fresh = _unchanged(ctx, ns, drafts)
        now = time.time()
        with lease.fenced() as pipe:
            for draft in fresh:
                _write(pipe, ctx, ns, draft, mode, now)
            pipe.set(keys.evolved(ns), cursor)
            if fresh:
                pipe.hincrby(keys.stats(ns), f"evolve_{_status(mode)}", len(fresh))
            if len(fresh) < len(drafts):
                pipe.hincrby(keys.stats(ns), "evolve_stale", len(drafts) - len(fresh))
            pipe.execute()
    return len(fresh)


def expire_settled(ctx: WorkerContext, ns: str, now: float) -> int:
    """Delete the settled proposal records made more than ``proposal_retention_days`` before
    ``now`` (oldest first, at most MAX_EXPIRED_PER_RUN per status); return how many."""
    days = ctx.settings.proposal_retention_days
    if days <= 0:
        return 0
    keys, cutoff = ctx.keys, now - days * 86_400
    pipe = ctx.redis.pipeline(transaction=False)
    for status in SETTLED:
        pipe.zrangebyscore(keys.proposals(ns, status), "-inf", cutoff, 0, MAX_EXPIRED_PER_RUN)
    old = dict(zip(SETTLED, pipe.execute(), strict=True))
    if not any(old.values()):
        return 0
    with (
        Lease(ctx.redis, keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer) as lease,
        lease.fenced() as fenced,
    ):
        for status, ids in old.items():
            if ids:
                fenced.zrem(keys.proposals(ns, status), *ids)
                fenced.delete(*(keys.proposal(ns, pid.decode()) for pid in ids))
        removed = fenced.execute()
    return sum(int(n) for n in removed[0::2])


def _unchanged(ctx: WorkerContext, ns: str, drafts: list[Draft]) -> list[Draft]:
    """The drafts whose note is active, holds what was read, and has no pending proposal."""
    pipe = ctx.redis.pipeline(transaction=False)
    for d in drafts:
        pipe.hmget(ctx.keys.note(ns, d.note), [*SNAPSHOT, "status"])
        pipe.hget(ctx.keys.proposed(ns), d.note)
    replies = pipe.execute()
    fresh = []
    for i, d in enumerate(drafts):
        *values, status = replies[2 * i]
        same = dict(zip(SNAPSHOT, values, strict=True)) == d.raw
        if status == b"active" and same and replies[2 * i + 1] is None:
            fresh.append(d)
    return fresh


def _status(mode: str) -> str:
    return "applied" if mode == "apply" else "pending"


def _write(pipe: Pipeline, ctx: WorkerContext, ns: str, d: Draft, mode: str, now: float) -> None:
    """One proposal record, its status index and audit entry; in apply mode the note too."""
    keys, pid, status = ctx.keys, new_id(), _status(mode)
    version = int(d.raw["version"] or 0)
    names = [*d.after, "version", "updated_at"]
    after_raw = {
        **notes.encode_fields(d.after),
        "version": str(version + 1),
        "updated_at": repr(now),
    }
    record: dict[str, Any] = {
        "id": pid,
        "note": d.note,
        "status": status,
        "source": d.source,
        "reason": d.reason,
        "fields": " ".join(d.after),
        "triggers": msgpack.packb(list(d.triggers), use_bin_type=True),
        "batch": msgpack.packb(list(d.batch), use_bin_type=True),
        "created_at": repr(now),
        "updated_at": repr(now),
    }
    if "tags" in d.after:
        old_tags = decode_value("tags", d.raw["tags"]) or []
        added = [t for t in d.after["tags"] if t not in old_tags]
        record["added"] = msgpack.packb(added, use_bin_type=True)
    for name in names:
        if d.raw[name] is not None:
            record[f"b:{name}"] = d.raw[name]
        record[f"a:{name}"] = after_raw[name]
    pipe.hset(keys.proposal(ns, pid), mapping=record)
    pipe.zadd(keys.proposals(ns, status), {pid: now})
    before = {**{n: decode_value(n, d.raw[n]) for n in d.after}, "version": version}
    after = {**d.after, "version": version + 1}
    source = f"{d.source} proposal:{pid}"
    if mode == "apply":
        pipe.hset(keys.note(ns, d.note), mapping={n: after_raw[n] for n in names})
        notes.changed(pipe, keys, ns)
        notes.audit(
            pipe,
            keys,
            ns,
            "evolve",
            d.note,
            actor="worker",
            source=source,
            before=before,
            after=after,
        )
    else:
        pipe.hset(keys.proposed(ns), d.note, pid)
        notes.audit(
            pipe,
            keys,
            ns,
            "evolve-propose",
            d.note,
            actor="worker",
            source=source,
            before=before,
            after={**after, "status": "pending"},
        )
