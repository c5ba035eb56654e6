"""The commit stage of an ingest batch: one fenced MULTI/EXEC that writes the batch's notes,
their links (both sides, after the degree cap), the change-log entry, the sequence tail and one
audit entry per note, and removes the old links of notes whose content changed."""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass, field
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from producer.protocol import StoreJob
from worker import vectors
from worker.context import WorkerContext
from worker.intake import construction
from worker.organise import judge as llm_judge
from worker.organise.linking import Step
from worker.store import degree, notes
from worker.store.lease import Lease
from worker.store.notes import Link
from worker.text import derive_tags

DEFAULT_IMPORTANCE = 0.5  #: importance of a note whose caller gave none


@dataclass
class Pending:
    """A store job that will be written, with what the batch computes for it."""

    entry_id: str
    job: StoreJob
    existing: dict[str, Any] | None
    seq: int = 0
    vec: npt.NDArray[np.float32] | None = None
    keywords: list[str] = field(default_factory=list)
    relink: bool = True
    context: str = ""
    kind: str | None = None  #: set when construction changes the note's kind
    parent: str | None = None  #: the source note of an atomic note
    terms: list[str] | None = None  #: BM25 terms, when construction already tokenised the content


def step_of(job: StoreJob) -> Step:
    return Step(job.id, job.event_time, job.agent, job.created_at)


def _fields(ctx: WorkerContext, p: Pending) -> dict[str, Any]:
    job, old = p.job, p.existing or {}
    keywords = p.keywords
    return {
        "id": job.id,
        "namespace": job.ns,
        "content": job.content,
        "kind": p.kind or old.get("kind", "note"),
        "keywords": keywords,
        "tags": derive_tags(
            keywords[: construction.AUTO_TAGS], job.tags, max_chars=ctx.settings.max_tag_chars
        ),
        "context": p.context,
        "metadata": job.metadata,
        "agent": job.agent,
        "created_at": old.get("created_at", job.created_at),
        "event_time": job.event_time,
        "importance": job.importance
        if job.importance is not None
        else float(old.get("importance", DEFAULT_IMPORTANCE)),
        "access_count": int(old.get("access_count", 0)),
        "last_access": float(old.get("last_access", 0.0)),
        "status": "active",
        "version": int(old.get("version", 0)) + 1,
        "embedder": ctx.embedder.name,
        "seq": p.seq,
        "src": p.entry_id,
        "updated_at": time.time(),
    }


def commit(
    ctx: WorkerContext,
    lease: Lease,
    ns: str,
    todo: list[Pending],
    links: list[Link],
    queued: list[bytes],
) -> str:
    """One MULTI/EXEC for the whole batch; returns the batch's change-log entry id."""
    keys = ctx.keys
    relinked = [p.job.id for p in todo if p.existing is not None and p.relink]
    old_links = notes.read_links(ctx.redis, keys, ns, relinked) if relinked else {}
    unlinked = [(nid, nb) for nid, nbs in old_links.items() for nb in nbs]
    capped = degree.plan_cap(ctx, ns, links, unlinked)
    by_note = _links_by_note(capped.links, [p.job.id for p in todo])
    writes = [
        notes.NoteWrite(p.job.id, p.seq, _fields(ctx, p), _vec_bytes(ctx, p), p.existing is None)
        for p in todo
    ]
    with lease.fenced() as pipe:
        for nid, nbs in old_links.items():
            notes.unlink_all(pipe, keys, ns, nid, nbs)
        notes.write_notes(pipe, keys, ns, writes, ctx.settings.changelog_max)
        change_at = len(pipe) - 1
        notes.changed(pipe, keys, ns)
        created = sum(w.created for w in writes)
        if created:
            pipe.execute_command("INCRBY", keys.seq(ns), created)
        added = notes.write_links(pipe, keys, ns, capped.links, source="rule:similarity")
        degree.apply_cap(pipe, ctx, ns, capped, actor="worker")
        if queued:
            pipe.rpush(keys.judge(ns), *queued)
            pipe.ltrim(keys.judge(ns), -llm_judge.MAX_QUEUED, -1)
        for p, w in zip(todo, writes, strict=True):
            after = {**notes.public_view(w.fields), "links": by_note[w.id]}
            notes.audit(
                pipe,
                keys,
                ns,
                "create" if w.created else "update",
                w.id,
                actor=p.job.agent or "unknown",
                source=f"inbox:{p.entry_id}",
                before=notes.public_view(p.existing) if p.existing else None,
                after=after,
            )
        pipe.hincrby(keys.stats(ns), "links", added - notes.undirected(set(old_links), old_links))
        pipe.hset(keys.stats(ns), "last_ingest", time.time())
        fresh = [p.job for p in todo if p.existing is None and p.parent is None]
        if fresh:
            tail = step_of(fresh[-1])
            pipe.set(keys.tail(ns), msgpack.packb(astuple(tail)))
        results = pipe.execute()
    return str(results[change_at].decode())


def _links_by_note(links: list[Link], ids: list[str]) -> dict[str, dict[str, list[Any]]]:
    """The new links of each of ``ids`` as {neighbour: [weight, reason, label]}, for its audit
    entry."""
    out: dict[str, dict[str, list[Any]]] = {nid: {} for nid in ids}
    for link in links:
        if link.a in out:
            out[link.a][link.b] = [link.weight, link.reason, link.label]
        if link.b in out:
            out[link.b][link.a] = [link.weight, link.reason, link.label]
    return out


def _vec_bytes(ctx: WorkerContext, p: Pending) -> bytes:
    return vectors.encode(vec_of(p), ctx.settings.vector_storage)


def vec_of(p: Pending) -> npt.NDArray[np.float32]:
    assert p.vec is not None, "every pending note has a vector by now"
    return p.vec.astype(np.float32, copy=False)
