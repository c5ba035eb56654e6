"""Near-duplicate merge: two notes that say the same thing become one.

The rule (``is_duplicate``, pure) is conservative; a pair is merged only when all of these hold:

- both are active plain notes (no insight), neither superseded, with the same ``event_time``
  (both none, or equal: the same fact observed at two times is two memories);
- their cosine is at least ``merge_min_cosine``;
- their content words (stemmed, stop words left out) overlap by at least ``merge_min_overlap``
  (Jaccard), and they carry exactly the same numbers and the same negations ("not", "no",
  "never", "n't", ...), so "every 30 days" never merges with "every 90 days", nor "uses X" with
  "no longer uses X".

The note accessed more often survives (on a tie, the older one). It takes the sum of both
access counts, the later last access, the higher importance, the union of the tags, the
metadata of both (its own values win; the other's are dropped when the union would pass
``max_metadata_bytes``) and the other's links, re-pointed on both sides with the larger weight
where both were linked to the same note (a note the other superseded now names the survivor in
``superseded_by``). The other note is tombstoned with ``merged_into`` (the survivor's id) and
leaves the index through the change log; the survivor lists it in ``merged_from``. A
``get()`` of the merged id returns the survivor. Both notes get a ``merge`` audit entry with
before and after (the survivor's names the ids it took in, not its whole ``merged_from``).

``merge_namespace`` looks at the notes created since its last run (at most MAX_NEW_PER_RUN) and
their MERGE_K nearest notes. Many copies of one text all have the same nearest notes (ties), so
merges are planned as stars (``find_duplicates``: the most durable note absorbs every duplicate
it is paired with), a note whose duplicates all merged into another note is compared with that
note directly (``adopt``), and the survivors and such notes are looked at again, with the
merged notes gone from the index, for up to MAX_ROUNDS rounds. A run applies at most
MAX_MERGES_PER_RUN merges, LOCK_CHUNK per hold of the namespace lock; its cursor stops before
the first new note it left unsettled, so the next run goes on from there.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.client import Pipeline

from producer.protocol import pack_link, unpack_link
from worker.context import WorkerContext
from worker.index.lexical import analyze
from worker.organise import pairs
from worker.organise.pairs import Text
from worker.store import notes
from worker.store.lease import Lease
from worker.text import tokenize

log = logging.getLogger(__name__)

JOINERS = re.compile(r"[-_/]")  #: split before comparing words
NEGATIONS = frozenset({"not", "no", "never", "nor", "none", "nothing", "cannot", "without"})
MERGE_K = 5  #: nearest notes looked at per new note
MAX_NEW_PER_RUN = 2_000  #: new notes merge_namespace looks at per run
MAX_MERGES_PER_RUN = 2_000  #: merges one run applies; the notes of the rest wait for the next
LOCK_CHUNK = 50  #: merges applied per hold of the namespace lock
MAX_ROUNDS = 8  #: times one run looks at new notes again whose duplicates merged elsewhere
CURSOR = "merge_seq"  #: stats field: the highest seq merge_namespace has looked at
STRUCTURAL = frozenset({"superseded_by", "supersedes"})  #: link reasons kept on re-pointing
#: Texts whose words and markers are kept between the pairs of a run (each note is in several)
TEXT_CACHE = 4_096


@functools.lru_cache(maxsize=TEXT_CACHE)
def _words(text: str) -> frozenset[str]:
    """Content words, stemmed, with compounds split ("key-pair" is "key pair")."""
    return frozenset(analyze(JOINERS.sub(" ", text)))


def overlap(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' content words (1.0 when both have none)."""
    left, right = _words(a), _words(b)
    return len(left & right) / len(left | right) if left | right else 1.0


@functools.lru_cache(maxsize=TEXT_CACHE)
def _markers(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The numbers and the negations of a text."""
    words = tokenize(text)
    numbers = frozenset(w for w in words if any(ch.isdigit() for ch in w))
    negations = frozenset(w for w in words if w in NEGATIONS or w.endswith("n't"))
    return numbers, negations


def is_duplicate(a: Text, b: Text, cosine: float, min_cosine: float, min_overlap: float) -> bool:
    """Whether two notes say the same thing (the rule in the module docstring)."""
    plain = all(t.active and t.kind == "note" and t.valid_to is None for t in (a, b))
    return (
        plain
        and a.id != b.id
        and a.event_time == b.event_time
        and cosine >= min_cosine
        and _markers(a.content) == _markers(b.content)
        and overlap(a.content, b.content) >= min_overlap
    )


def survivor(a: Text, b: Text) -> tuple[Text, Text]:
    """(kept, merged): the more accessed note survives, then the older one, then the lower id."""
    kept = min((a, b), key=lambda t: (-t.access_count, t.created_at, t.id))
    return kept, (b if kept is a else a)


@dataclass(frozen=True)
class MergePlan:
    """What one round merges, and the notes it leaves unsettled: in a duplicate pair, but each
    duplicate of theirs is merged into another note (``adopt`` may merge them into that one)."""

    merges: list[tuple[str, str, float]]  #: (kept, merged, cosine), in the order to apply them
    #: unsettled note -> the survivors its duplicates merge into
    unsettled: dict[str, set[str]]


def find_duplicates(
    news: Sequence[Text],
    near: dict[str, list[tuple[str, float]]],
    texts: dict[str, Text],
    min_cosine: float,
    min_overlap: float,
) -> MergePlan:
    """The merges of one round, as stars: the most durable note (``survivor``'s order) absorbs
    every duplicate it is paired with, most similar first, then the next most durable note not
    merged away absorbs those left, and so on; a note merged away absorbs none. Each merged note
    is a duplicate of its own survivor (the rule is not transitive)."""
    paired = duplicate_pairs(news, near, texts, min_cosine, min_overlap)
    merges: list[tuple[str, str, float]] = []
    into: dict[str, str] = {}
    unsettled: dict[str, set[str]] = {}
    for kept in sorted(paired, key=lambda nid: _durability(texts[nid])):
        if kept in into:
            continue
        # a partner not merged yet is less durable: a more durable one would have taken kept
        took = [(o, c) for o, c in sorted(paired[kept].items(), key=_closest) if o not in into]
        into.update((other, kept) for other, _ in took)
        merges += [(kept, other, cosine) for other, cosine in took]
        if not took:
            unsettled[kept] = {into[other] for other in paired[kept]}
    return MergePlan(merges, unsettled)


def adopt(
    plan: MergePlan,
    texts: dict[str, Text],
    cosines: Mapping[tuple[str, str], float],
    min_cosine: float,
    min_overlap: float,
) -> list[tuple[str, str, float]]:
    """Merges of unsettled notes, each into the most similar survivor its duplicates merge into
    that is a duplicate of it too (``cosines``: of (note, survivor) pairs; a pair left out is
    not compared). Such a survivor was more durable than the note, so it stays the survivor."""
    out: list[tuple[str, str, float]] = []
    for nid, targets in plan.unsettled.items():
        near = sorted(((cosines[nid, t], t) for t in targets if (nid, t) in cosines), reverse=True)
        match = next(
            (
                (t, nid, cos)
                for cos, t in near
                if is_duplicate(texts[nid], texts[t], cos, min_cosine, min_overlap)
            ),
            None,
        )
        if match is not None:
            out.append(match)
    return out


def _closest(partner: tuple[str, float]) -> tuple[float, str]:
    return -partner[1], partner[0]


def duplicate_pairs(
    news: Sequence[Text],
    near: dict[str, list[tuple[str, float]]],
    texts: dict[str, Text],
    min_cosine: float,
    min_overlap: float,
) -> dict[str, dict[str, float]]:
    """Each new note and near note in a duplicate pair -> its partners and their cosine."""
    pairs: dict[str, dict[str, float]] = {}
    for new in news:
        for nb, cosine in near.get(new.id, []):
            other = texts.get(nb)
            if other is not None and is_duplicate(new, other, cosine, min_cosine, min_overlap):
                pairs.setdefault(new.id, {})[nb] = cosine
                pairs.setdefault(nb, {})[new.id] = cosine
    return pairs


def _durability(t: Text) -> tuple[int, float, str]:
    """Sort key of ``survivor``: the more accessed, then the older, then the lower id first."""
    return -t.access_count, t.created_at, t.id


def merge_namespace(ctx: WorkerContext, ns: str) -> int:
    """Merge the near-duplicates among the notes created since the last run and their nearest
    notes (at most MAX_MERGES_PER_RUN); return how many notes were merged away. The cursor
    stops before the first new note left unsettled, which the next run looks at again."""
    if not ctx.settings.merge:
        return 0
    started = time.perf_counter()
    fresh = pairs.new_since(ctx, ns, CURSOR, MAX_NEW_PER_RUN)
    done = 0
    if fresh:
        done, unsettled = _merge_rounds(ctx, ns, [nid for nid, _ in fresh])
        ctx.redis.hset(ctx.keys.stats(ns), CURSOR, settled_up_to(fresh, unsettled))
    ctx.redis.hset(ctx.keys.stats(ns), "last_merge", time.time())
    log.info(
        "merge ns=%s looked_at=%d merged=%d in %.1fms",
        ns,
        len(fresh),
        done,
        (time.perf_counter() - started) * 1000,
    )
    return done


def _merge_rounds(ctx: WorkerContext, ns: str, ids: list[str]) -> tuple[int, set[str]]:
    """Merge the duplicates among ``ids`` and their nearest notes; then look again at the notes
    left unsettled and at the survivors, whose nearest notes are others now (the merged ones
    left the index); until a round merges nothing, for at most MAX_ROUNDS rounds and
    MAX_MERGES_PER_RUN merges. Returns the merges done and the notes still to look at."""
    done, todo = 0, ids
    for _ in range(MAX_ROUNDS):
        merges, unsettled = _plan_round(ctx, ns, todo)
        merged, left = _merge_all(ctx, ns, merges, MAX_MERGES_PER_RUN - done)
        done += merged
        again = unsettled | left | {kept for kept, _, _ in merges}
        todo = [nid for nid in dict.fromkeys([*todo, *again]) if nid in again]
        if not merged or not todo or done >= MAX_MERGES_PER_RUN:
            break
    return done, set(todo)


def _plan_round(
    ctx: WorkerContext, ns: str, ids: list[str]
) -> tuple[list[tuple[str, str, float]], set[str]]:
    """One round's merges (stars, then the unsettled notes adopted by their duplicates'
    survivors) and the notes it leaves unsettled."""
    s = ctx.settings
    near = pairs.nearest(ctx, ns, ids, MERGE_K, s.merge_min_cosine)
    texts = pairs.read_texts(ctx, ns, [*ids, *(nb for row in near.values() for nb, _ in row)])
    news = [texts[nid] for nid in ids if nid in texts]
    plan = find_duplicates(news, near, texts, s.merge_min_cosine, s.merge_min_overlap)
    asked = [(nid, t) for nid, targets in plan.unsettled.items() for t in targets]
    cosines = pairs.cosines(ctx, ns, asked) if asked else {}
    adopted = adopt(plan, texts, cosines, s.merge_min_cosine, s.merge_min_overlap)
    return plan.merges + adopted, set(plan.unsettled) - {gone for _, gone, _ in adopted}


def settled_up_to(fresh: Sequence[tuple[str, int]], unsettled: set[str]) -> int:
    """The new cursor: the seq just before the first of ``fresh`` (id, seq, in seq order) that
    is unsettled, else the last seq."""
    first = next((seq for nid, seq in fresh if nid in unsettled), None)
    return fresh[-1][1] if first is None else first - 1


def _merge_all(
    ctx: WorkerContext, ns: str, merges: Sequence[tuple[str, str, float]], budget: int
) -> tuple[int, set[str]]:
    """Apply the first ``budget`` merges, LOCK_CHUNK at a time under the namespace lock (so
    ingest goes on between chunks); return how many were applied and the notes of those that
    were not (over the budget, or no longer duplicates)."""
    done, left = 0, {nid for kept, gone, _ in merges[budget:] for nid in (kept, gone)}
    todo = list(merges[:budget])
    for start in range(0, len(todo), LOCK_CHUNK):
        with Lease(ctx.redis, ctx.keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer) as lease:
            for kept, merged, cosine in todo[start : start + LOCK_CHUNK]:
                lease.renew()
                if merge_pair(ctx, ns, lease, kept, merged, cosine):
                    done += 1
                else:
                    left |= {kept, merged}
    return done, left


@dataclass
class _Plan:
    """What one merge reads under the lock and writes."""

    kept: str
    merged: str
    k: dict[str, Any]  #: the survivor's fields
    m: dict[str, Any]  #: the merged note's fields
    links: dict[str, dict[str, float]]  #: both notes' links
    #: the merged note's link metas, both sides
    metas: dict[str, tuple[dict[str, Any], dict[str, Any]]]
    moved: dict[str, float]  #: links the survivor takes over, with their weights
    after: dict[str, Any]  #: the survivor's changed fields


def merge_pair(
    ctx: WorkerContext, ns: str, lease: Lease, kept: str, merged: str, cosine: float
) -> int:
    """Merge ``merged`` into ``kept`` (judged at ``cosine``) in one fenced MULTI/EXEC; the
    caller holds the namespace lock. 0 when the two no longer pass the rule, else 1."""
    keys, s = ctx.keys, ctx.settings
    texts = pairs.read_texts(ctx, ns, [kept, merged])
    if len(texts) < 2 or not is_duplicate(
        texts[kept], texts[merged], cosine, s.merge_min_cosine, s.merge_min_overlap
    ):
        return 0
    why = f"cosine {cosine:.2f}"
    plan = _plan(ctx, ns, kept, merged)
    clusters = _clusters_with(ctx, ns, merged, kept)
    with lease.fenced() as pipe:
        notes.changed(pipe, keys, ns)
        notes.unlink_all(pipe, keys, ns, merged, plan.links[merged])
        notes.tombstone_all(
            pipe, keys, ns, {merged: int(plan.m["seq"])}, ctx.settings.changelog_max
        )
        pipe.hset(keys.note(ns, merged), "merged_into", kept)
        pipe.hset(keys.note(ns, kept), mapping=notes.encode_fields(plan.after))
        pipe.hincrby(keys.note(ns, kept), "access_count", int(plan.m.get("access_count", 0)))
        _repoint(pipe, ctx, ns, kept, plan.moved, plan.metas)
        if clusters:
            pipe.hset(keys.clusters(ns), mapping=clusters)
        added = sum(1 for nb in plan.moved if nb not in plan.links[kept])
        pipe.hincrby(keys.stats(ns), "links", added - len(plan.links[merged]))
        pipe.hincrby(keys.stats(ns), "merged", 1)
        _audit(pipe, ctx, ns, plan, f"merge:{why}")
        pipe.execute()
    log.info("merged ns=%s %s into %s (%s)", ns, merged, kept, why)
    return 1


def _plan(ctx: WorkerContext, ns: str, kept: str, merged: str) -> _Plan:
    keys = ctx.keys
    raw = notes.read_notes(ctx.redis, keys, ns, [kept, merged])
    k, m = notes.unpack_fields(raw[kept]), notes.unpack_fields(raw[merged])
    links = notes.read_links(ctx.redis, keys, ns, [kept, merged])
    metas = _metas(ctx, ns, merged, links[merged])
    moved = {
        nb: max(w, links[kept].get(nb, 0.0))
        for nb, w in links[merged].items()
        if nb != kept and (w > links[kept].get(nb, -1.0) or _reason(metas[nb][1]) in STRUCTURAL)
    }
    return _Plan(kept, merged, k, m, links, metas, moved, _combined(ctx, k, m, merged))


def _audit(pipe: Pipeline, ctx: WorkerContext, ns: str, plan: _Plan, source: str) -> None:
    """One merge entry for each note, with before and after. The survivor's names the ids it
    takes in (``merged``) instead of its whole ``merged_from``, so that each entry stays small
    however many notes merge into one."""
    kept, merged, k, m = plan.kept, plan.merged, plan.k, plan.m
    changed = {f: v for f, v in plan.after.items() if f != "merged_from"}
    notes.audit(
        pipe,
        ctx.keys,
        ns,
        "merge",
        merged,
        actor="worker",
        source=source,
        before={**notes.public_view(m), "links": plan.links[merged]},
        after={"status": "tombstoned", "merged_into": kept},
    )
    count = int(k.get("access_count", 0))
    notes.audit(
        pipe,
        ctx.keys,
        ns,
        "merge",
        kept,
        actor="worker",
        source=source,
        before={
            **{f: k.get(f) for f in changed if f != "updated_at"},
            "access_count": count,
            "links": plan.links[kept],
        },
        after={
            **changed,
            "merged": [merged, *m.get("merged_from", [])],
            "access_count": count + int(m.get("access_count", 0)),
            "links": {**plan.links[kept], **plan.moved},
        },
    )


def _metas(
    ctx: WorkerContext, ns: str, merged: str, nbs: dict[str, float]
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """For each neighbour of the merged note, the link meta, as stored, on the merged note's
    side and on the neighbour's side ({} where a side has none)."""
    pipe = ctx.redis.pipeline(transaction=False)
    pipe.hgetall(ctx.keys.links(ns, merged))
    for nb in nbs:
        pipe.hget(ctx.keys.links(ns, nb), merged)
    own, *rows = pipe.execute()
    return {
        nb: (_stored(own.get(nb.encode())), _stored(raw)) for nb, raw in zip(nbs, rows, strict=True)
    }


def _stored(raw: bytes | None) -> dict[str, Any]:
    return unpack_link(raw)[1] if raw else {}


def _reason(meta: dict[str, Any]) -> str:
    return str(meta.get("reason", ""))


def _repoint(
    pipe: Pipeline,
    ctx: WorkerContext,
    ns: str,
    kept: str,
    moved: dict[str, float],
    metas: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """The merged note's links that win, now the survivor's, both sides with their metas."""
    keys = ctx.keys
    fallback = {"reason": "merged", "source": "merge", "at": time.time()}
    for nb, weight in moved.items():
        mine, theirs = metas[nb]
        pipe.hset(keys.links(ns, kept), nb, pack_link(weight, mine or fallback))
        pipe.hset(keys.links(ns, nb), kept, pack_link(weight, theirs or fallback))
        if _reason(theirs) == "superseded_by":
            pipe.hset(keys.note(ns, nb), "superseded_by", kept)


def _clusters_with(ctx: WorkerContext, ns: str, merged: str, kept: str) -> dict[str, bytes]:
    """Consolidation clusters that held the merged note, with the survivor in its place."""
    out: dict[str, bytes] = {}
    for iid, raw in ctx.redis.hgetall(ctx.keys.clusters(ns)).items():
        members = msgpack.unpackb(raw, raw=False)
        if merged in members:
            renamed = sorted({kept if mid == merged else mid for mid in members})
            out[iid.decode()] = msgpack.packb(renamed)
    return out


def _combined(
    ctx: WorkerContext, k: dict[str, Any], m: dict[str, Any], merged: str
) -> dict[str, Any]:
    """The survivor's fields that change (access_count is added separately, atomically)."""
    s = ctx.settings
    tags = list(dict.fromkeys([*k.get("tags", []), *m.get("tags", [])]))[: s.max_tags]
    metadata = {**m.get("metadata", {}), **k.get("metadata", {})}
    if len(msgpack.packb(metadata, use_bin_type=True)) > s.max_metadata_bytes:
        metadata = k.get("metadata", {})
    return {
        "tags": tags,
        "metadata": metadata,
        "importance": max(float(k.get("importance", 0.5)), float(m.get("importance", 0.5))),
        "last_access": max(float(k.get("last_access", 0.0)), float(m.get("last_access", 0.0))),
        "merged_from": [*k.get("merged_from", []), merged, *m.get("merged_from", [])],
        "version": int(k.get("version", 0)) + 1,
        "updated_at": time.time(),
    }
