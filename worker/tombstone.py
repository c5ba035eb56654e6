"""Tombstoning: a deleted or evicted note leaves the index and the active set, loses its vector
and its links (from both sides), keeps its hash as a tombstone, and gets an audit entry."""

from __future__ import annotations

from producer.protocol import DeleteJob
from worker import construction, notes
from worker.commit import undirected
from worker.context import WorkerContext
from worker.lease import Lease
from worker.projection import Projection, catch_up


def delete_jobs(
    ctx: WorkerContext, proj: Projection, lease: Lease, entries: list[tuple[str, DeleteJob]]
) -> None:
    """Tombstone the notes a batch's delete jobs name that are still active, with the atomic
    notes split off those that are source notes."""
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
        pipe.hincrby(keys.stats(ns), "links", -undirected(set(existing), neighbours))
        pipe.execute()
    with proj.lock:
        catch_up(ctx, proj)
    return len(existing)
