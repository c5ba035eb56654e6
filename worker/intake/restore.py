"""Restore jobs (``zettelq import`` of a zettelq export, docs/transfer.md): write notes exactly
as they were exported, under the namespace lock, in one fenced MULTI/EXEC per batch.

A restored note keeps its id, content, kind, keywords, tags, context, metadata, agent, times,
importance, access counts, version, validity and supersession, merges and the cluster an
insight abstracts. It is not re-judged, re-linked or checked for supersession: its links are
the exported ones. A link is written (both ends, each end with its own exported metadata) when
the second of its two notes is restored, so the notes of an export can arrive in any order and
every link stored always has both ends. A restore of an id that already is a note is a no-op,
which makes an import idempotent and a re-run after an interruption duplicate nothing. Only
the vector is new: the target's embedder embeds the content.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgpack
from redis.client import Pipeline

from producer import validation as v
from producer.errors import InvalidInput
from producer.protocol import MAX_LABEL_BYTES, LinkSide, RestoreJob, pack_link
from worker import vectors
from worker.bulk import BulkPipeline
from worker.context import WorkerContext
from worker.index.projection import Projection, catch_up
from worker.intake import construction
from worker.models.vector_cache import embed_cached
from worker.settings import WorkerSettings
from worker.store import notes
from worker.store.lease import Lease

log = logging.getLogger(__name__)

KINDS = frozenset({"note", "insight", construction.SOURCE_KIND})  #: kinds a note can have
MAX_KEYWORD_CHARS = 64  #: longest keyword a restored note may carry
MAX_LIST_IDS = 10_000  #: most ids in a restored note's merged_from or cluster
MAX_VERSION = 2**31  #: highest version (and access count) accepted
MAX_WEIGHT = 1e6  #: highest link weight accepted
MAX_LINK_TEXT_CHARS = 2_000  #: longest link reason or source

Entry = tuple[str, RestoreJob]  #: (inbox entry id, job)


def check_restore(job: RestoreJob, s: WorkerSettings) -> RestoreJob:
    """Raise InvalidInput naming the first field outside the limits (the worker re-checks
    every job: what reaches the inbox is untrusted)."""
    v.check_namespace(job.ns)
    v.check_id(job.id)
    v.check_text(job.content, "content", s.max_content_bytes)
    if job.kind not in KINDS:
        raise InvalidInput(f"kind must be one of {sorted(KINDS)}, got {job.kind!r:.40}")
    if job.context:
        v.check_text(job.context, "context", s.max_content_bytes)
    v.check_agent(job.agent)
    v.check_metadata(job.metadata, s.max_metadata_bytes)
    v.check_tags(job.tags, s.max_tags + construction.AUTO_TAGS, s.max_tag_chars)
    v.check_tags(job.keywords, construction.MAX_KEYWORDS * 4, MAX_KEYWORD_CHARS)
    _check_numbers(job)
    _check_ids([x for x in (job.superseded_by, job.merged_into) if x is not None], "successor")
    _check_ids(job.merged_from, "merged_from")
    _check_ids(job.cluster or [], "cluster")
    _check_links(job, s)
    return job


def _check_numbers(job: RestoreJob) -> None:
    for name in ("created_at", "updated_at", "event_time", "valid_to"):
        v.check_time(getattr(job, name), name)
    if job.last_access:
        v.check_time(job.last_access, "last_access")
    for name in ("importance", "importance_auto", "importance_prior"):
        v.check_unit_float(getattr(job, name), name)
    v.check_int(job.access_count, "access_count", 0, MAX_VERSION)
    v.check_int(job.version, "version", 1, MAX_VERSION)


def _check_links(job: RestoreJob, s: WorkerSettings) -> None:
    if len(job.links) > s.max_degree + s.max_links + 2:
        raise InvalidInput(f"{len(job.links)} links; the limit is max_degree + max_links + 2")
    for link in job.links:
        v.check_id(link.target)
        for side in (link, link.back):
            if side is not None:
                _check_side(side, s)


def _check_ids(ids: Sequence[str], name: str) -> None:
    if len(ids) > MAX_LIST_IDS:
        raise InvalidInput(f"{name} holds {len(ids)} ids; the limit is {MAX_LIST_IDS}")
    for nid in ids:
        v.check_id(nid)


def _check_side(side: LinkSide, s: WorkerSettings) -> None:
    if not math.isfinite(side.weight) or not 0 <= side.weight <= MAX_WEIGHT:
        raise InvalidInput(f"a link weight must be a number from 0 to {MAX_WEIGHT:g}")
    if len(side.label.encode()) > MAX_LABEL_BYTES:
        raise InvalidInput(f"a link label takes at most {MAX_LABEL_BYTES} bytes")
    if len(side.reason) > MAX_LINK_TEXT_CHARS or len(side.source) > MAX_LINK_TEXT_CHARS:
        raise InvalidInput(f"a link reason or source takes at most {MAX_LINK_TEXT_CHARS} chars")
    if side.at is not None and not v.MIN_EPOCH_S <= side.at <= v.MAX_EPOCH_S:
        v.check_time(side.at, "link at")  # raises the error that says why
    if side.model_extra:
        v.check_metadata(side.model_extra, s.max_metadata_bytes)


def link_meta(side: LinkSide) -> dict[str, Any]:
    """The metadata stored with one end of a link (empty label, reason and source left out)."""
    meta = {"label": side.label, "reason": side.reason, "source": side.source, "at": side.at}
    meta.update(side.model_extra or {})
    return {k: x for k, x in meta.items() if x is not None and x != ""}


def restore_jobs(
    ctx: WorkerContext, proj: Projection, lease: Lease, entries: Sequence[Entry]
) -> dict[str, Any]:
    """Write the jobs whose ids are not notes yet; returns the index's stats after it (empty
    when every job was a no-op)."""
    ns = proj.ns
    first: dict[str, Entry] = {}
    for entry in entries:
        first.setdefault(entry[1].id, entry)
    existing = notes.read_notes(ctx.redis, ctx.keys, ns, list(first))
    todo = [e for nid, e in first.items() if not notes.is_note(existing.get(nid))]
    if not todo:
        return {}
    active = [(eid, job) for eid, job in todo if job.status == "active"]
    vecs = embed_cached(ctx, [job.content for _, job in active])
    storage = ctx.settings.vector_storage
    vec_of = {
        job.id: vectors.encode(vec, storage) for (_, job), vec in zip(active, vecs, strict=True)
    }
    stored = _present(ctx, ns, {link.target for _, job in active for link in job.links})
    last_seq = int(ctx.redis.get(ctx.keys.seq(ns)) or 0)
    _commit(ctx, lease, ns, todo, vec_of, stored, last_seq)
    with proj.lock:
        catch_up(ctx, proj)
        stats = {"index_kind": proj.index.kind, "index_size": len(proj.index)}
    log.info("restore batch ns=%s n=%d of %d", ns, len(todo), len(entries))
    return stats


def _present(ctx: WorkerContext, ns: str, ids: set[str]) -> set[str]:
    """Which of ``ids`` are active notes of ``ns``."""
    order = sorted(ids)
    if not order:
        return set()
    pipe = BulkPipeline(ctx.redis)
    for nid in order:
        pipe.queue("HGET", ctx.keys.note(ns, nid), "status")
    return {nid for nid, status in zip(order, pipe.execute(), strict=True) if status == b"active"}


def _commit(
    ctx: WorkerContext,
    lease: Lease,
    ns: str,
    todo: list[Entry],
    vec_of: dict[str, bytes],
    stored: set[str],
    last_seq: int,
) -> None:
    """The batch's notes, links, clusters and audit entries; a link to a note of the batch is
    written with the later of its two notes."""
    keys, s = ctx.keys, ctx.settings
    writes = [
        notes.NoteWrite(job.id, last_seq + i, _fields(ctx, eid, job, last_seq + i), b"", True)
        for i, (eid, job) in enumerate(todo, start=1)
    ]
    live = [w for w in writes if w.id in vec_of]
    for w in live:
        w.vec = vec_of[w.id]
    dead = [w for w in writes if w.id not in vec_of]
    link_args, links = _plan_links(ctx, ns, todo, vec_of, stored)
    with lease.fenced() as pipe:
        notes.changed(pipe, keys, ns)
        if live:
            notes.write_notes(pipe, keys, ns, live, s.changelog_max)
        for w in dead:
            _write_tombstone(pipe, ctx, ns, w)
        pipe.execute_command("INCRBY", keys.seq(ns), len(writes))
        for key, args in link_args.items():
            pipe.execute_command("HSET", key, *args)
        for (eid, job), w in zip(todo, writes, strict=True):
            if job.cluster is not None:
                pipe.hset(keys.clusters(ns), job.id, msgpack.packb(list(job.cluster)))
            notes.audit(
                pipe,
                keys,
                ns,
                "restore",
                job.id,
                actor=job.agent or "import",
                source=f"import:{eid}",
                after={**notes.public_view(w.fields), "links": len(job.links)},
            )
        pipe.hincrby(keys.stats(ns), "links", links)
        pipe.execute()
    ctx.redis.sadd(keys.namespaces(), ns)  # another slot than the namespace's on a cluster


def _fields(ctx: WorkerContext, entry_id: str, job: RestoreJob, seq: int) -> dict[str, Any]:
    data = job.model_dump(exclude={"v", "op", "ns", "sig", "links", "cluster"})
    fields = {k: x for k, x in data.items() if x is not None and k != "merged_from"}
    if job.merged_from:
        fields["merged_from"] = job.merged_from
    for name in ("agent", "event_time"):  # None as ingest has them (its audit names them)
        fields[name] = data[name]
    fields.update(namespace=job.ns, embedder=ctx.embedder.name, seq=seq, src=entry_id)
    return fields


def _write_tombstone(pipe: Pipeline, ctx: WorkerContext, ns: str, w: notes.NoteWrite) -> None:
    """A merged (or otherwise tombstoned) note: its hash (with its seq) and place in the
    tombstone set, outside the index."""
    keys = ctx.keys
    args = [x for pair in notes.encode_note(w.fields).items() for x in pair]
    pipe.execute_command("HSET", keys.note(ns, w.id), *args)
    pipe.execute_command("ZADD", keys.tombstoned(ns), w.fields.get("updated_at") or 0.0, w.id)


def _plan_links(
    ctx: WorkerContext, ns: str, todo: list[Entry], vec_of: dict[str, bytes], stored: set[str]
) -> tuple[dict[str, list[Any]], int]:
    """The HSET arguments of each links hash the batch writes, and how many links: both ends of
    each link whose other note is already there (stored before, or restored earlier in the
    batch), each end as its note's line gives it."""
    present = set(stored)
    args: dict[str, list[Any]] = defaultdict(list)
    count = 0
    for _, job in todo:
        if job.id not in vec_of:
            continue
        for link in job.links:
            if link.target not in present or link.target == job.id:
                continue
            back = link.back or link
            args[ctx.keys.links(ns, job.id)] += (
                link.target,
                pack_link(link.weight, link_meta(link)),
            )
            args[ctx.keys.links(ns, link.target)] += (
                job.id,
                pack_link(back.weight, link_meta(back)),
            )
            count += 1
        present.add(job.id)
    return args, count
