"""Organise a namespace's jobs from one drained batch: embed, find candidates, judge links,
commit notes + links + change log + audit in one MULTI/EXEC, then update the projection.

Runs under the namespace lock so that two workers never organise one namespace at once.
Idempotent: each note records the inbox entry that last wrote it (``src``), and a redelivered
entry at or before that is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from itertools import groupby
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from producer.protocol import DeleteJob, StoreJob
from worker import bulk, construction, degree, llm_judge, notes, supersession
from worker.bulk import BulkPipeline
from worker.context import WorkerContext
from worker.keywords import derive_tags, tokenize
from worker.lease import Lease
from worker.lexical import analyze, stem, terms_of
from worker.linking import (
    Candidate,
    Link,
    Step,
    batch_candidates,
    dedupe_links,
    judge,
    sequence_links,
)
from worker.projection import CATCH_UP_CHUNK, Prefetched, Projection, catch_up
from worker.vector_cache import embed_cached

log = logging.getLogger(__name__)

Job = StoreJob | DeleteJob
Entry = tuple[str, Job]  #: (inbox entry id, job)
DEFAULT_IMPORTANCE = 0.5  #: importance of a note whose caller gave none
PART_OF_WEIGHT = 1.0  #: weight of the link from an atomic note to its source
#: A young namespace judges keyword rarity as if it held this many more unrelated notes, so its
#: first notes can link on a shared keyword.
RARITY_PSEUDO_DOCS = 20


@dataclass
class _Pending:
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


def handle_jobs(ctx: WorkerContext, ns: str, entries: Sequence[Entry]) -> None:
    """Apply a namespace's jobs in inbox order (stores batched, deletes in between) under the
    namespace lock. Every write is a fenced commit, which refuses to apply once the lock is
    lost. When the jobs start with stores, the lock is taken in the round trip that reads the
    first round's stored notes; it is released in the one that records the index's stats."""
    lock = Lease(ctx.redis, ctx.keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer)
    proj = ctx.projection(ns)
    groups = [(op, list(group)) for op, group in groupby(entries, key=lambda e: e[1].op)]
    first: _Read | None = None
    if groups and groups[0][0] == "store":
        try:
            first = _read(ctx, proj, _rounds(groups[0][1])[0], lock)  # type: ignore[arg-type]
        except BaseException:
            lock.release()
            raise
        if not lock.held:
            first = None  # read without the lock: read again once it is taken
    index_stats: dict[str, Any] = {}
    with lock as lease:
        with lease.kept():
            for op, items in groups:
                if op != "store":
                    _delete(ctx, proj, lease, items)  # type: ignore[arg-type]
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
        _Pending(eid, job, notes.unpack_fields(existing[nid]) if nid in existing else None)
        for nid, (eid, job) in latest.items()
        if not _already_applied(existing.get(nid), eid)
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
    changes = _commit(ctx, lease, ns, todo, links, queued)
    with proj.lock:
        if proj.position == position:
            _apply(proj, todo)
            proj.position = changes
        else:
            catch_up(ctx, proj)
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


def _sequence(ctx: WorkerContext, tail: bytes | None, todo: list[_Pending]) -> list[Link]:
    """Sequence links among the batch's new notes and to the namespace's previous note
    (``tail``, as stored)."""
    s = ctx.settings
    steps = [_step(p.job) for p in todo if p.existing is None and p.parent is None]
    if not steps or s.sequence_weight <= 0:
        return []
    previous = Step(*msgpack.unpackb(tail)) if tail else None
    return sequence_links(previous, steps, s.sequence_window_s, s.sequence_weight)


def _step(job: StoreJob) -> Step:
    return Step(job.id, job.event_time, job.agent, job.created_at)


def _already_applied(fields: notes.Fields | None, entry_id: str) -> bool:
    src = fields.get(b"src") if fields else None
    return src is not None and notes.stream_pos(src) >= notes.stream_pos(entry_id)


def _prepare(ctx: WorkerContext, todo: list[_Pending], last_seq: int) -> None:
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
        for p, vec in zip(to_embed, vecs, strict=True):
            p.vec = vec
    if reuse:
        stored = ctx.redis.pipeline(transaction=False)
        for p in reuse:
            stored.hget(ctx.keys.note(p.job.ns, p.job.id), "vec")
        for p, raw in zip(reuse, stored.execute(), strict=True):
            p.vec = np.frombuffer(raw, dtype=np.float32)


def _construct(
    ctx: WorkerContext, proj: Projection, lease: Lease, todo: list[_Pending]
) -> list[_Pending]:
    """Keywords and context of each note (a note whose content is unchanged keeps its stored
    ones); returns the atomic notes split off long inputs, to be written with the batch. Atoms
    an updated input no longer has are tombstoned first."""
    changed = [p for p in todo if _content_changed(p)]
    for p in todo:
        if p.existing is not None and not _content_changed(p):
            p.keywords = list(p.existing.get("keywords", []))
            p.context = p.existing.get("context") or construction.lead_context(p.job.content)
    tokens = [tokenize(p.job.content) for p in changed]
    built = construction.construct(ctx, proj.ns, [p.job for p in changed], tokens)
    ids = {p.job.id for p in todo}
    atoms: list[_Pending] = []
    for p, b, words in zip(changed, built, tokens, strict=True):
        p.keywords, p.context, p.terms = b.keywords, b.context, terms_of(words)
        jobs = [
            (job, fields) for job, fields in construction.atom_jobs(p.job, b) if job.id not in ids
        ]
        p.kind = construction.SOURCE_KIND if jobs else _unsplit_kind(p)
        atoms += [
            _Pending(p.entry_id, job, None, keywords=f.keywords, context=f.context, parent=p.job.id)
            for job, f in jobs
        ]
    resplit = [p for p in changed if (p.existing or {}).get("kind") == construction.SOURCE_KIND]
    if resplit:
        _retire_atoms(ctx, proj, lease, resplit, {a.job.id for a in atoms})
    return _with_existing(ctx, proj.ns, atoms)


def _content_changed(p: _Pending) -> bool:
    old = p.existing
    return old is None or old.get("content") != p.job.content or old["status"] != "active"


def _unsplit_kind(p: _Pending) -> str | None:
    """A former source note that is no longer split becomes a plain note again."""
    was_source = (p.existing or {}).get("kind") == construction.SOURCE_KIND
    return "note" if was_source else None


def _with_existing(ctx: WorkerContext, ns: str, atoms: list[_Pending]) -> list[_Pending]:
    """Atomic notes with their stored versions attached (an input split again rewrites them)."""
    if not atoms:
        return []
    existing = notes.read_notes(ctx.redis, ctx.keys, ns, [a.job.id for a in atoms])
    for a in atoms:
        if a.job.id in existing:
            a.existing = notes.unpack_fields(existing[a.job.id])
    return atoms


def _retire_atoms(
    ctx: WorkerContext, proj: Projection, lease: Lease, resplit: list[_Pending], keep: set[str]
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


def _part_of(todo: list[_Pending]) -> list[Link]:
    """A link from each atomic note to its source."""
    return [
        Link(p.job.id, p.parent, PART_OF_WEIGHT, construction.PART_OF)
        for p in todo
        if p.parent is not None
    ]


@dataclass
class _Found:
    """What linking needs from the projection, copied out under its lock."""

    linking: list[_Pending]
    candidates: list[list[Candidate]]
    rarity: dict[str, float]


def _find(ctx: WorkerContext, proj: Projection, todo: list[_Pending]) -> _Found:
    """Index candidates of the notes to link and their keywords' rarity (caller holds the lock;
    kept short so searches in this process are not held up by the judging)."""
    s = ctx.settings
    linking = [p for p in todo if p.relink] if s.link_k and s.max_links else []
    if not linking:
        return _Found([], [], {})
    scores, seqs = proj.index.search(_stack(linking), min(s.link_k + 1, max(len(proj.index), 1)))
    ids, keywords, none = proj.ids, proj.keywords, frozenset[str]()
    candidates = [
        [
            Candidate(ids[q], v, keywords.get(q, none))
            for v, q in zip(vs, qs, strict=True)
            if q in ids
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
    rarity = found.rarity
    links: list[Link] = []
    queued: list[bytes] = []
    for i, nid in enumerate(ids):
        candidates = found.candidates[i] + in_batch[i]
        links += judge(
            nid,
            kws[i],
            candidates,
            s.link_threshold,
            s.max_links,
            lambda kw: rarity.get(kw, 0.0),
            s.link_min_shared_idf,
        )
        if s.judge == "llm":
            queued += llm_judge.request(nid, found.linking[i].entry_id, candidates, s)
    return dedupe_links(links), queued


def _fields(ctx: WorkerContext, p: _Pending) -> dict[str, Any]:
    job, old = p.job, p.existing or {}
    keywords = p.keywords
    return {
        "id": job.id,
        "namespace": job.ns,
        "content": job.content,
        "kind": p.kind or old.get("kind", "note"),
        "keywords": keywords,
        "tags": derive_tags(keywords[: construction.AUTO_TAGS], job.tags),
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


def _commit(
    ctx: WorkerContext,
    lease: Lease,
    ns: str,
    todo: list[_Pending],
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
        notes.NoteWrite(p.job.id, p.seq, _fields(ctx, p), _vec(p).tobytes(), p.existing is None)
        for p in todo
    ]
    with lease.fenced() as pipe:
        for nid, nbs in old_links.items():
            notes.unlink_all(pipe, keys, ns, nid, nbs)
        notes.write_notes(pipe, keys, ns, writes, ctx.settings.changelog_max)
        change_at = len(pipe) - 1
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
        pipe.hincrby(keys.stats(ns), "links", added - _undirected(set(old_links), old_links))
        pipe.hset(keys.stats(ns), "last_ingest", time.time())
        fresh = [p.job for p in todo if p.existing is None and p.parent is None]
        if fresh:
            tail = _step(fresh[-1])
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


def _vec(p: _Pending) -> npt.NDArray[np.float32]:
    assert p.vec is not None, "every pending note has a vector by now"
    return p.vec.astype(np.float32, copy=False)


def _stack(items: list[_Pending]) -> npt.NDArray[np.float32]:
    return np.vstack([_vec(p) for p in items])


def _apply(proj: Projection, todo: list[_Pending]) -> None:
    vecs = _stack(todo)
    kws = [frozenset(p.keywords) for p in todo]
    terms = [analyze(p.job.content) if p.terms is None else p.terms for p in todo]
    proj.add([p.seq for p in todo], [p.job.id for p in todo], vecs, kws, terms)


def _delete(
    ctx: WorkerContext, proj: Projection, lease: Lease, entries: list[tuple[str, DeleteJob]]
) -> None:
    ns = proj.ns
    ids = list(dict.fromkeys(job.id for _, job in entries))
    existing = notes.read_notes(ctx.redis, ctx.keys, ns, ids)
    live = [nid for nid in ids if existing.get(nid, {}).get(b"status") == b"active"]
    if not live:
        return
    actors = {job.id: job.agent or "unknown" for _, job in entries}
    sources = {job.id: eid for eid, job in entries}
    victims = {nid: existing[nid] for nid in live}
    split = [nid for nid, f in victims.items() if f.get(b"kind") == b"source"]
    for aid, (parent, fields) in construction.stored_atoms(ctx, ns, split, set(victims)).items():
        victims[aid], actors[aid], sources[aid] = fields, actors[parent], sources[parent]
    tombstone_notes(ctx, proj, lease, victims, "delete", actors, sources)


def tombstone_notes(
    ctx: WorkerContext,
    proj: Projection,
    lease: Lease,
    existing: dict[str, notes.Fields],
    op: str,
    actors: dict[str, str],
    sources: dict[str, str],
) -> int:
    """Tombstone notes and unlink them from both sides (delete and eviction share this)."""
    keys, ns = ctx.keys, proj.ns
    neighbours = notes.read_links(ctx.redis, keys, ns, list(existing))
    with lease.fenced() as pipe:
        for nid in existing:
            notes.unlink_all(pipe, keys, ns, nid, neighbours[nid])
        seqs = {nid: int(fields[b"seq"]) for nid, fields in existing.items()}
        notes.tombstone_all(pipe, keys, ns, seqs, ctx.settings.changelog_max)
        for nid, fields in existing.items():
            before = {**notes.public_view(notes.unpack_fields(fields)), "links": neighbours[nid]}
            notes.audit(
                pipe,
                keys,
                ns,
                op,
                nid,
                actor=actors.get(nid, "worker"),
                source=sources.get(nid, op),
                before=before,
                after={"status": "tombstoned"},
            )
        pipe.hincrby(keys.stats(ns), "links", -_undirected(set(existing), neighbours))
        pipe.execute()
    with proj.lock:
        catch_up(ctx, proj)
    return len(existing)


def _undirected(removed: set[str], neighbours: dict[str, dict[str, float]]) -> int:
    """Links removed, counting a link between two removed notes once."""
    total = 0
    for nid, nbs in neighbours.items():
        total += sum(1 for nb in nbs if nb not in removed or nb > nid)
    return total
