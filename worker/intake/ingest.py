"""Organise a namespace's jobs from one drained batch: embed, find candidates, judge links,
commit notes + links + change log + audit in one MULTI/EXEC (worker/intake/commit.py), then update
the projection. Deletes tombstone their notes (worker/store/tombstone.py).

Runs under the namespace lock so that two workers never organise one namespace at once.
Exactly once in effect: each id records the inbox entry of the last store or delete applied to it
(``src``), and a job at or before that entry (redelivered, reclaimed, or retried from the
dead-letter stream with its original entry id) is a no-op.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from producer.protocol import DeleteJob, RestoreJob, StoreJob
from worker import bulk, vectors
from worker.bulk import BulkPipeline
from worker.context import WorkerContext
from worker.index.lexical import RARITY_PSEUDO_DOCS, analyze, stem, terms_of
from worker.index.projection import CATCH_UP_CHUNK, Prefetched, Projection, catch_up
from worker.intake import construction, restore
from worker.intake.commit import Pending, commit, step_of, vec_of
from worker.intake.deletes import delete_jobs
from worker.models.vector_cache import embed_cached
from worker.organise import judge as llm_judge
from worker.organise import supersession
from worker.organise.linking import (
    Candidate,
    Step,
    batch_candidates,
    dedupe_links,
    judge,
    sequence_links,
)
from worker.store import notes
from worker.store.lease import Lease
from worker.store.notes import Link
from worker.store.tombstone import tombstone_notes
from worker.text import lead_sentence, tokenize

log = logging.getLogger(__name__)

Job = StoreJob | DeleteJob | RestoreJob
Entry = tuple[str, Job]  #: (inbox entry id, job)
PART_OF_WEIGHT = 1.0  #: weight of the link from an atomic note to its source


def handle_jobs(ctx: WorkerContext, ns: str, entries: Sequence[Entry]) -> None:
    """Apply a namespace's jobs in inbox order (stores batched, deletes and restores in
    between) under the namespace lock. Every write is a fenced commit, which refuses to apply
    once the lock is lost. When the jobs start with stores, the lock is taken in the round trip
    that reads the first round's stored notes; it is released in the one that records the
    index's stats."""
    lock = Lease(ctx.redis, ctx.keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer)
    proj = ctx.projection(ns)
    groups = [(op, list(group)) for op, group in groupby(entries, key=lambda e: e[1].op)]
    first = _read_taking(ctx, proj, groups, lock)
    index_stats: dict[str, Any] = {}
    with lock as lease:
        with lease.kept():
            for op, items in groups:
                if op == "restore":
                    restored = restore.restore_jobs(ctx, proj, lease, items)  # type: ignore[arg-type]
                    index_stats = restored or index_stats
                    continue
                if op != "store":
                    delete_jobs(ctx, proj, lease, items)  # type: ignore[arg-type]
                    continue
                for round_ in _rounds(items):
                    read = first or _read(ctx, proj, round_)  # type: ignore[arg-type]
                    index_stats = _store(ctx, proj, lease, read) or index_stats
                    first = None
        pipe = ctx.redis.pipeline(transaction=False)
        if index_stats:
            pipe.hset(ctx.keys.stats(ns), mapping=index_stats)
            pipe.sadd(ctx.keys.namespaces(), ns)
        lease.release(pipe)
    if index_stats:
        ctx.shed(keep=ns)


def _read_taking(
    ctx: WorkerContext, proj: Projection, groups: list[tuple[str, list[Entry]]], lock: Lease
) -> _Read | None:
    """When the jobs start with stores, the first round's read, in the round trip that tries
    to take ``lock``; None when they do not, or when another held the lock (the round is then
    read again once it is taken)."""
    if not groups or groups[0][0] != "store":
        return None
    try:
        read = _read(ctx, proj, _rounds(groups[0][1])[0], lock)  # type: ignore[arg-type]
    except BaseException:
        lock.release()
        raise
    return read if lock.held else None


def _rounds(entries: list[Entry]) -> list[list[Entry]]:
    """Split so no id repeats within a round: a second write of an id is applied (and audited)
    as an update after the first, not folded into it."""
    rounds: list[list[Entry]] = []
    seen: list[set[str]] = []
    for entry in entries:
        i = next((n for n, ids in enumerate(seen) if entry[1].id not in ids), len(rounds))
        if i == len(rounds):
            rounds.append([])
            seen.append(set())
        rounds[i].append(entry)
        seen[i].add(entry[1].id)
    return rounds


@dataclass
class _Read:
    """A round of store jobs with what the first round trip read for it."""

    entries: list[tuple[str, StoreJob]]
    existing: dict[str, notes.Fields]
    last_seq: int  #: the last seq given out in the namespace
    tail: bytes | None  #: the namespace's previous note, for sequence links
    logged: Prefetched  #: the change log after the projection's position


def _read(
    ctx: WorkerContext,
    proj: Projection,
    entries: list[tuple[str, StoreJob]],
    lock: Lease | None = None,
) -> _Read:
    """One round trip: the stored versions of the round's notes, and three keys that only the
    namespace's writers (who hold its lock) change: the last seq given out, the sequence tail
    and the change log. With ``lock`` (not yet held), the same round trip first tries to take
    it (``lock.held`` tells whether it did); the reads come after it, so what they return stays
    true while the lock is held."""
    ns = proj.ns
    pipe = BulkPipeline(ctx.redis)
    if lock is not None:
        lock.queue_acquire(pipe)
    read = notes.queue_notes(pipe, ctx.keys, ns, [job.id for _, job in entries])
    pipe.queue("GET", ctx.keys.seq(ns))
    pipe.queue("GET", ctx.keys.tail(ns))
    seen = proj.position
    pipe.queue("XRANGE", ctx.keys.changes(ns), f"({seen}", "+", "COUNT", CATCH_UP_CHUNK)
    replies = pipe.execute()
    if lock is not None:
        lock.acquired(replies[0])
    logged: Prefetched = (seen, [(eid, bulk.fields(flat)) for eid, flat in replies[-1]])
    return _Read(entries, read(replies), int(replies[-3] or 0), replies[-2], logged)


def _store(ctx: WorkerContext, proj: Projection, lease: Lease, read: _Read) -> dict[str, Any]:
    """Organise and commit one round; returns the index's stats after it (empty when every
    job had already been applied)."""
    started = time.perf_counter()
    ns = proj.ns
    latest = {job.id: (eid, job) for eid, job in read.entries}  # ids are unique within a round
    existing = read.existing
    todo = [
        Pending(eid, job, _stored(existing.get(nid)))
        for nid, (eid, job) in latest.items()
        if not notes.reflects(existing.get(nid), eid)
    ]
    if not todo:
        return {}
    todo += _construct(ctx, proj, lease, todo)
    _prepare(ctx, todo, read.last_seq)
    with proj.lock:
        catch_up(ctx, proj, read.logged)
        position = proj.position
        found = _find(ctx, proj, todo)
    similar, queued = _propose(ctx, found)
    links = dedupe_links(similar + _sequence(ctx, read.tail, todo) + _part_of(todo))
    changes = commit(ctx, lease, ns, todo, links, queued)
    with proj.lock:
        if proj.position == position:
            _apply(proj, todo)
            proj.position = changes
        else:
            catch_up(ctx, proj)
    proj.settle_soon()  # a rebuild it makes due runs apart: drains and searches go on
    index_stats = {"index_kind": proj.index.kind, "index_size": len(proj.index)}
    supersession.on_ingest(ctx, lease, ns, {p.job.id: p.job.content for p in todo if p.relink})
    log.info(
        "store batch ns=%s n=%d links=%d in %.1fms",
        ns,
        len(todo),
        len(links),
        (time.perf_counter() - started) * 1000,
    )
    return index_stats


def _sequence(ctx: WorkerContext, tail: bytes | None, todo: list[Pending]) -> list[Link]:
    """Sequence links among the batch's new notes and to the namespace's previous note
    (``tail``, as stored)."""
    s = ctx.settings
    steps = [step_of(p.job) for p in todo if p.existing is None and p.parent is None]
    if not steps or s.sequence_weight <= 0:
        return []
    previous = Step(*msgpack.unpackb(tail)) if tail else None
    return sequence_links(previous, steps, s.sequence_window_s, s.sequence_weight)


def _stored(fields: notes.Fields | None) -> dict[str, Any] | None:
    """The stored note a store job updates; None when there is none (or only a delete's fence)."""
    return notes.unpack_fields(fields) if fields is not None and notes.is_note(fields) else None


def _prepare(ctx: WorkerContext, todo: list[Pending], last_seq: int) -> None:
    """Seqs for new notes (after ``last_seq``, the last one given out; the commit advances
    it), and one embedder call for every changed content (and every note embedded by another
    model) that the vector cache lacks."""
    fresh = [p for p in todo if p.existing is None]
    for offset, p in enumerate(fresh, start=1):
        p.seq = last_seq + offset
    for p in todo:
        if p.existing is not None:
            p.seq = int(p.existing["seq"])
            p.relink = (
                p.existing.get("content") != p.job.content or p.existing["status"] != "active"
            )
    model = ctx.embedder.name
    stale = [p.relink or (p.existing or {}).get("embedder") != model for p in todo]
    to_embed = [p for p, s in zip(todo, stale, strict=True) if s]
    reuse = [p for p, s in zip(todo, stale, strict=True) if not s]
    if to_embed:
        vecs = embed_cached(ctx, [p.job.content for p in to_embed])
        storage = ctx.settings.vector_storage
        for p, vec in zip(to_embed, vecs, strict=True):
            p.vec = vectors.as_stored(vec, storage)
    if reuse:
        stored = ctx.redis.pipeline(transaction=False)
        for p in reuse:
            stored.hget(ctx.keys.note(p.job.ns, p.job.id), "vec")
        for p, raw in zip(reuse, stored.execute(), strict=True):
            p.vec = vectors.decode(raw)


def _construct(
    ctx: WorkerContext, proj: Projection, lease: Lease, todo: list[Pending]
) -> list[Pending]:
    """Keywords and context of each note (a note whose content is unchanged keeps its stored
    ones); returns the atomic notes split off long inputs, to be written with the batch. Atoms
    an updated input no longer has are tombstoned first."""
    changed = [p for p in todo if _content_changed(p)]
    for p in todo:
        if p.existing is not None and not _content_changed(p):
            p.keywords = list(p.existing.get("keywords", []))
            p.context = p.existing.get("context") or lead_sentence(
                p.job.content, construction.CONTEXT_MAX_CHARS
            )
    tokens = [tokenize(p.job.content) for p in changed]
    built = construction.construct(ctx, proj.ns, [p.job for p in changed], tokens)
    ids = {p.job.id for p in todo}
    atoms: list[Pending] = []
    for p, b, words in zip(changed, built, tokens, strict=True):
        p.keywords, p.context, p.terms = b.keywords, b.context, terms_of(words)
        jobs = [
            (job, fields) for job, fields in construction.atom_jobs(p.job, b) if job.id not in ids
        ]
        p.kind = construction.SOURCE_KIND if jobs else _unsplit_kind(p)
        atoms += [
            Pending(p.entry_id, job, None, keywords=f.keywords, context=f.context, parent=p.job.id)
            for job, f in jobs
        ]
    resplit = [p for p in changed if (p.existing or {}).get("kind") == construction.SOURCE_KIND]
    if resplit:
        _retire_atoms(ctx, proj, lease, resplit, {a.job.id for a in atoms})
    return _with_existing(ctx, proj.ns, atoms)


def _content_changed(p: Pending) -> bool:
    old = p.existing
    return old is None or old.get("content") != p.job.content or old["status"] != "active"


def _unsplit_kind(p: Pending) -> str | None:
    """A former source note that is no longer split becomes a plain note again."""
    was_source = (p.existing or {}).get("kind") == construction.SOURCE_KIND
    return "note" if was_source else None


def _with_existing(ctx: WorkerContext, ns: str, atoms: list[Pending]) -> list[Pending]:
    """Atomic notes with their stored versions attached (an input split again rewrites them)."""
    if not atoms:
        return []
    existing = notes.read_notes(ctx.redis, ctx.keys, ns, [a.job.id for a in atoms])
    for a in atoms:
        a.existing = _stored(existing.get(a.job.id))
    return atoms


def _retire_atoms(
    ctx: WorkerContext, proj: Projection, lease: Lease, resplit: list[Pending], keep: set[str]
) -> None:
    """Tombstone the atomic notes of changed source notes that their new split (if any) does
    not rewrite."""
    by_id = {p.job.id: p for p in resplit}
    stale = construction.stored_atoms(ctx, proj.ns, list(by_id), keep)
    if stale:
        actors = {aid: by_id[parent].job.agent or "unknown" for aid, (parent, _) in stale.items()}
        sources = {aid: f"inbox:{by_id[parent].entry_id}" for aid, (parent, _) in stale.items()}
        victims = {aid: fields for aid, (_, fields) in stale.items()}
        tombstone_notes(ctx, proj, lease, victims, "delete", actors, sources)


def _part_of(todo: list[Pending]) -> list[Link]:
    """A link from each atomic note to its source."""
    return [
        Link(p.job.id, p.parent, PART_OF_WEIGHT, construction.PART_OF)
        for p in todo
        if p.parent is not None
    ]


@dataclass
class _Found:
    """What linking needs from the projection, copied out under its lock."""

    linking: list[Pending]
    candidates: list[list[Candidate]]
    rarity: dict[str, float]


def _find(ctx: WorkerContext, proj: Projection, todo: list[Pending]) -> _Found:
    """Index candidates of the notes to link and their keywords' rarity (caller holds the lock;
    kept short so searches in this process are not held up by the judging)."""
    s = ctx.settings
    linking = [p for p in todo if p.relink] if s.link_k and s.max_links else []
    if not linking:
        return _Found([], [], {})
    scores, seqs = proj.index.search(_stack(linking), min(s.link_k + 1, max(len(proj.index), 1)))
    ids, keywords = proj.ids, proj.keywords
    candidates = [
        [
            Candidate(nid, v, keywords.get(q, ()))
            for v, q in zip(vs, qs, strict=True)
            if (nid := ids.get(q)) is not None
        ]
        for vs, qs in zip(scores.tolist(), seqs.tolist(), strict=True)
    ]
    # A shared keyword is one of the new note's: only those need a rarity.
    words = {kw for p in linking for kw in p.keywords}
    rarity = {kw: proj.lexical.idf(stem(kw), RARITY_PSEUDO_DOCS) for kw in words}
    return _Found(linking, candidates, rarity)


def _propose(ctx: WorkerContext, found: _Found) -> tuple[list[Link], list[bytes]]:
    """Index and same-batch candidates judged into links by the heuristic judge (no lock
    needed), and, with the LLM judge on, each note's candidates queued for it."""
    s = ctx.settings
    if not found.linking:
        return [], []
    ids = [p.job.id for p in found.linking]
    kws = [frozenset(p.keywords) for p in found.linking]
    in_batch = batch_candidates(ids, _stack(found.linking), kws, s.link_k)
    rarity = found.rarity.__getitem__  # every keyword of a note to link has one
    links: list[Link] = []
    queued: list[bytes] = []
    for i, nid in enumerate(ids):
        candidates = found.candidates[i] + in_batch[i]
        links += judge(
            nid, kws[i], candidates, s.link_threshold, s.max_links, rarity, s.link_min_shared_idf
        )
        if s.judge == "llm":
            queued += llm_judge.request(nid, found.linking[i].entry_id, candidates, s)
    return dedupe_links(links), queued


def _stack(items: list[Pending]) -> npt.NDArray[np.float32]:
    return np.vstack([vec_of(p) for p in items])


def _apply(proj: Projection, todo: list[Pending]) -> None:
    vecs = _stack(todo)
    kws = [p.keywords for p in todo]
    terms = [analyze(p.job.content) if p.terms is None else p.terms for p in todo]
    proj.add([p.seq for p in todo], [p.job.id for p in todo], vecs, kws, terms)
