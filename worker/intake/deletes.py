"""A batch's delete jobs: which notes they tombstone. A delete newer than what its id reflects
tombstones the note when it is active, and with a source note the atomic notes split off it;
every such delete records its inbox entry on the id, so an older store of that id is a no-op."""

from __future__ import annotations

from producer.protocol import DeleteJob
from worker.context import WorkerContext
from worker.index.projection import Projection
from worker.intake import construction
from worker.store import notes
from worker.store.lease import Lease
from worker.store.tombstone import tombstone_notes


def delete_jobs(
    ctx: WorkerContext, proj: Projection, lease: Lease, entries: list[tuple[str, DeleteJob]]
) -> None:
    """Apply a batch's delete jobs that are newer than what their ids reflect: tombstone the
    active notes among them, with the atomic notes split off those that are source notes, and
    record each delete's entry on its id (``notes.fence_deleted``)."""
    ns = proj.ns
    fences = {job.id: eid for eid, job in entries}  # in inbox order: the last delete of each id
    existing = notes.read_notes(ctx.redis, ctx.keys, ns, list(fences))
    fences = {nid: eid for nid, eid in fences.items() if not notes.reflects(existing.get(nid), eid)}
    if not fences:
        return
    actors = {job.id: job.agent or "unknown" for _, job in entries}
    sources = dict(fences)
    victims = {nid: existing[nid] for nid in fences if _active(existing.get(nid))}
    split = [nid for nid, f in victims.items() if f.get(b"kind") == b"source"]
    for aid, (parent, fields) in construction.stored_atoms(ctx, ns, split, set(victims)).items():
        victims[aid], actors[aid], sources[aid] = fields, actors[parent], sources[parent]
        fences[aid] = fences[parent]
    tombstone_notes(ctx, proj, lease, victims, "delete", actors, sources, fences)


def _active(fields: notes.Fields | None) -> bool:
    return fields is not None and fields.get(b"status") == b"active"
