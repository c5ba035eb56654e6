"""Consolidation: one insight note per dense cluster of linked notes (the "sleep" phase of the
self-organising Zettelkasten tutorial).

A cluster is a connected group of at least MIN_CLUSTER active notes other than insights, held
together by topical links (not STRUCTURAL_REASONS such as "sequence") of weight >=
``consolidate_min_weight``; a superseded note takes part only through its supersession link, so
it joins the cluster of the note that replaced it (the notes of one change); a group larger than
``consolidate_max_cluster`` is split along its weakest links until every part fits (computed
bottom up, in one pass over the links, however many distinct weights they have). Each cluster
gets an insight note (kind ``insight``): an extractive summary by default — the first sentence
of its most central members still valid, at most INSIGHT_MAX_CHARS — or the LLM's summary when
one is configured and answers well (any LLM failure falls back to the extractive summary). The
insight links ``abstracted_from`` (source "consolidation") to every member, is embedded and
enters the change log like any note, so it is searchable.

Idempotent. ``Keys.clusters`` maps each insight id to the members it abstracts:
- a cluster equal to, or inside, a known cluster gets nothing new;
- a grown cluster (a proper superset of a known one) updates that insight (audited "update");
- any other cluster creates an insight whose id is a hash of its sorted member ids (audited
  "create"), so two runs racing on the same cluster write one note.
An insight deleted or evicted by someone is never recreated or updated.

Policy (``find_clusters``, ``plan_insights``, ``summarise``) is pure; ``consolidate_namespace``
reads the graph, summarises and embeds outside the namespace lock, then re-checks and commits
every insight of the run in one MULTI/EXEC under the lock.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgpack
from pydantic import BaseModel, Field
from redis.client import Pipeline

from worker import vectors
from worker.context import WorkerContext
from worker.models.vector_cache import embed_cached
from worker.organise import llm
from worker.store import notes
from worker.store.graph import Graph, read_graph
from worker.store.lease import Lease
from worker.store.notes import Link
from worker.text import SENTENCE_END, derive_tags, extract_keywords, lead_sentence

log = logging.getLogger(__name__)

Adjacency = Mapping[str, Mapping[str, float]]

MIN_CLUSTER = 3  #: fewest notes a cluster needs
INSIGHT_MAX_CHARS = 600  #: longest insight summary
PROMPT_NOTE_CHARS = 500  #: each member's content is cut to this in an LLM prompt
INSIGHT_LINK_WEIGHT = 0.5  #: weight of an abstracted_from link
INSIGHT_TAG = "insight"  #: tag every insight carries
MAX_INSIGHTS_PER_RUN = 20  #: insights one namespace run writes; the rest wait for the next run
FIELDS = ("kind", "content", "importance", "superseded_by")
#: Link reasons that record structure rather than shared subject; they never bind a cluster.
STRUCTURAL_REASONS = frozenset(
    {"sequence", "abstracted_from", "superseded_by", "supersedes", "merged_into"}
)
#: Reasons of the two sides of a supersession link: the only links that bind a superseded note
#: to a cluster (the one of the note that replaced it).
SUPERSESSION_REASONS = frozenset({"superseded_by", "supersedes"})


@dataclass(frozen=True)
class Plan:
    """An insight to write: its id, the members it abstracts, and the members it abstracted
    before (None when it is new)."""

    insight_id: str
    members: tuple[str, ...]
    previous: tuple[str, ...] | None


@dataclass(frozen=True)
class Draft:
    plan: Plan
    content: str
    source: str  #: "extractive" or "model:<name>"


class InsightAnswer(BaseModel):
    """What the LLM answers for one cluster."""

    summary: str = Field(min_length=1, max_length=INSIGHT_MAX_CHARS)
    sources: list[llm.ShownRef] = Field(min_length=1)


def find_clusters(
    links: Adjacency, min_weight: float, max_size: int, min_size: int = MIN_CLUSTER
) -> list[tuple[str, ...]]:
    """Groups of notes joined by links of at least ``min_weight``, each of ``min_size`` to
    ``max_size`` notes, as sorted id tuples in sorted order.

    A connected group larger than ``max_size`` is split along its weakest links, and each part
    again until every part fits. That is single-linkage clustering cut at ``max_size``, so it is
    built bottom up instead (no recursion, one pass over the links): parts grow by joining over
    the links from the strongest weight down, all links of one weight at once, and a group of
    parts that one weight would join into more than ``max_size`` notes is final as it stands."""
    edges = sorted(
        (
            (w, a, b)
            for a, nbs in links.items()
            for b, w in nbs.items()
            if w >= min_weight and b in links and b != a
        ),
        key=lambda edge: -edge[0],
    )
    forest = _Forest(links)
    for _, level in itertools.groupby(edges, key=lambda edge: edge[0]):
        forest.join([(a, b) for _, a, b in level], max_size)
    return sorted(tuple(sorted(p)) for p in forest.parts() if len(p) >= min_size)


class _Forest:
    """Union-find over note ids for ``find_clusters``: each tree is a part; a frozen part never
    joins another (a group it was in grew past the size cap)."""

    def __init__(self, ids: Iterable[str]) -> None:
        self.parent = {nid: nid for nid in ids}
        self.size = dict.fromkeys(self.parent, 1)
        self.frozen: set[str] = set()

    def root(self, nid: str) -> str:
        top = nid
        while self.parent[top] != top:
            top = self.parent[top]
        while self.parent[nid] != top:  # path compression
            self.parent[nid], nid = top, self.parent[nid]
        return top

    def join(self, pairs: Sequence[tuple[str, str]], max_size: int) -> None:
        """Join the parts that ``pairs`` (the links of one weight) connect, group by group,
        where the group fits in ``max_size`` and holds no frozen part; freeze the others."""
        adj: dict[str, dict[str, float]] = {}
        for a, b in pairs:
            ra, rb = self.root(a), self.root(b)
            if ra != rb:
                adj.setdefault(ra, {})[rb] = 0.0
                adj.setdefault(rb, {})[ra] = 0.0
        for group in _components(adj, adj):
            if sum(self.size[r] for r in group) > max_size or group & self.frozen:
                self.frozen |= group
                continue
            top, *rest = sorted(group)
            for r in rest:
                self.parent[r] = top
                self.size[top] += self.size.pop(r)

    def parts(self) -> list[set[str]]:
        out: dict[str, set[str]] = {}
        for nid in self.parent:
            out.setdefault(self.root(nid), set()).add(nid)
        return list(out.values())


def _components(adj: Adjacency, nodes: Iterable[str]) -> list[set[str]]:
    """Connected components of ``nodes`` over ``adj`` (visited in sorted order)."""
    seen: set[str] = set()
    out: list[set[str]] = []
    for start in sorted(nodes):
        if start in seen:
            continue
        comp, frontier = {start}, [start]
        while frontier:
            frontier = [nb for nid in frontier for nb in adj.get(nid, {}) if nb not in comp]
            comp.update(frontier)
        seen |= comp
        out.append(comp)
    return out


def insight_id(members: Sequence[str]) -> str:
    """The id of the insight first written for these members: a hash of their sorted ids."""
    digest = hashlib.sha256("\n".join(sorted(members)).encode()).hexdigest()
    return f"insight-{digest[:24]}"


def plan_insights(
    clusters: Sequence[tuple[str, ...]],
    known: Mapping[str, tuple[str, ...]],
    retired: set[str],
) -> list[Plan]:
    """What to write for each cluster given the known insight -> members map; ``retired``
    insights (deleted or evicted) are left alone."""
    plans: list[Plan] = []
    for cluster in clusters:
        members = set(cluster)
        if any(members <= set(old) for old in known.values()):
            continue
        grown = sorted(
            ((iid, old) for iid, old in known.items() if set(old) < members),
            key=lambda item: (-len(item[1]), item[0]),
        )
        if grown:
            iid, old = grown[0]
            if iid not in retired:
                plans.append(Plan(iid, cluster, old))
        elif insight_id(cluster) not in known:
            plans.append(Plan(insight_id(cluster), cluster, None))
    return plans


def centrality_order(members: Sequence[str], links: Adjacency) -> list[str]:
    """Members by the weight of their links inside the cluster, highest first (ties by id)."""
    inside = set(members)

    def degree(nid: str) -> float:
        return sum(w for nb, w in links.get(nid, {}).items() if nb in inside)

    return sorted(members, key=lambda nid: (-degree(nid), nid))


def summarise(ordered_contents: Sequence[str], max_chars: int = INSIGHT_MAX_CHARS) -> str:
    """The first sentence of each content, in order, without repeats, within ``max_chars``
    (the first one cut short with an ellipsis when it alone is too long)."""
    picked: list[str] = []
    length = -1
    for content in ordered_contents:
        sentence = SENTENCE_END.split(content.strip(), maxsplit=1)[0].strip()
        if not sentence or sentence in picked:
            continue
        if length + 1 + len(sentence) > max_chars:
            if not picked:
                picked.append(sentence[: max_chars - 1].rstrip() + "\u2026")
            break
        picked.append(sentence)
        length += 1 + len(sentence)
    return " ".join(picked)


def consolidate_namespace(ctx: WorkerContext, ns: str) -> int:
    """Write the insights ``ns`` is missing (at most MAX_INSIGHTS_PER_RUN); return how many
    were created or updated."""
    started = time.perf_counter()
    now = time.time()
    graph = read_graph(ctx, ns, FIELDS, reasons=True)
    known = _known(ctx, ns)
    retired = {iid for iid in known if iid not in graph.fields}
    plans = plan_insights(_clusters(ctx, graph), known, retired)
    drafts = [_draft(ctx, ns, graph, plan) for plan in plans[:MAX_INSIGHTS_PER_RUN]]
    written = _commit(ctx, ns, drafts, graph) if drafts else 0
    if len(plans) <= MAX_INSIGHTS_PER_RUN:
        ctx.redis.hset(ctx.keys.stats(ns), "last_consolidate", now)
    log.info(
        "consolidated ns=%s clusters=%d written=%d in %.1fms",
        ns,
        len(plans),
        written,
        (time.perf_counter() - started) * 1000,
    )
    return written


def _known(ctx: WorkerContext, ns: str) -> dict[str, tuple[str, ...]]:
    raw = ctx.redis.hgetall(ctx.keys.clusters(ns))
    return {k.decode(): tuple(msgpack.unpackb(v, raw=False)) for k, v in raw.items()}


def _clusters(ctx: WorkerContext, graph: Graph) -> list[tuple[str, ...]]:
    """Clusters over the topical links between notes other than insights. A superseded note
    takes part only through its supersession links, so it joins the cluster of the note that
    replaced it (the notes of a change: what was, why, what is now) and never one of its own."""
    s = ctx.settings
    insights = {nid for nid, f in graph.fields.items() if f["kind"] == b"insight"}
    superseded = {nid for nid, f in graph.fields.items() if f["superseded_by"] is not None}

    def binds(nid: str, nb: str) -> bool:
        reason = graph.reasons[nid].get(nb, "")
        if reason in SUPERSESSION_REASONS:
            return True
        return nid not in superseded and nb not in superseded and reason not in STRUCTURAL_REASONS

    links = {
        nid: {nb: w for nb, w in nbs.items() if nb not in insights and binds(nid, nb)}
        for nid, nbs in graph.links.items()
        if nid not in insights
    }
    return find_clusters(links, s.consolidate_min_weight, s.consolidate_max_cluster)


def _content(graph: Graph, nid: str) -> str:
    return (graph.fields[nid]["content"] or b"").decode()


def _draft(ctx: WorkerContext, ns: str, graph: Graph, plan: Plan) -> Draft:
    """The insight's text: the LLM's when configured and it answers well, else extractive, from
    the members still valid (a superseded member is no longer true; the LLM sees it marked)."""
    ordered = centrality_order(plan.members, graph.links)
    shown = llm.number_items(ordered)
    prompt = (
        "These notes are linked into one cluster. Write one insight, at most "
        f"{INSIGHT_MAX_CHARS} characters, that states what they say together (as true now: a "
        "note marked REPLACED no longer holds), and list the numbers of the notes it draws on "
        "as sources.\n\n"
        + "\n".join(
            f"[{n}] {_replaced(graph, nid)}{_content(graph, nid)[:PROMPT_NOTE_CHARS]}"
            for n, nid in shown.items()
        )
    )
    if ctx.settings.llm_url is not None:
        answer = llm.ask_json(ctx, ns, prompt, InsightAnswer, shown=shown)
        if answer is not None:
            return Draft(plan, answer.summary.strip(), f"model:{ctx.settings.llm_model}")
    valid = [nid for nid in ordered if not _replaced(graph, nid)] or ordered
    return Draft(plan, summarise([_content(graph, nid) for nid in valid]), "extractive")


def _replaced(graph: Graph, nid: str) -> str:
    """The prompt's mark of a superseded member ("" for a valid one)."""
    return "REPLACED " if graph.fields[nid]["superseded_by"] is not None else ""


def _commit(ctx: WorkerContext, ns: str, drafts: list[Draft], graph: Graph) -> int:
    """Embed, then under the namespace lock write the drafts still valid in one MULTI/EXEC."""
    vecs = embed_cached(ctx, [d.content for d in drafts])
    keys = ctx.keys
    with (
        Lease(ctx.redis, keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer) as lease,
        lease.kept(),
    ):
        fresh = [(d, v) for d, v in zip(drafts, vecs, strict=True) if _still_valid(ctx, ns, d)]
        if not fresh:
            return 0
        ids = [d.plan.insight_id for d, _ in fresh]
        existing = notes.read_notes(ctx.redis, keys, ns, ids)
        linked = notes.read_links(ctx.redis, keys, ns, ids)
        seqs = _seqs(ctx, ns, ids, existing)
        pipe = ctx.redis.pipeline(transaction=True)
        storage = ctx.settings.vector_storage
        writes = [
            _write(ctx, ns, d, vectors.encode(vec, storage), seqs, existing, graph)
            for d, vec in fresh
        ]
        notes.write_notes(pipe, keys, ns, writes, ctx.settings.changelog_max)
        notes.changed(pipe, keys, ns)
        links = [
            Link(d.plan.insight_id, m, INSIGHT_LINK_WEIGHT, "abstracted_from", "abstracted_from")
            for d, _ in fresh
            for m in d.plan.members
        ]
        notes.write_links(pipe, keys, ns, links, source="consolidation")
        for (d, _), w in zip(fresh, writes, strict=True):
            _audit(pipe, ctx, ns, d, w)
            pipe.hset(keys.clusters(ns), d.plan.insight_id, msgpack.packb(list(d.plan.members)))
        # a member linked to the insight already (e.g. by similarity at ingest) keeps one link
        new_links = sum(link.b not in linked[link.a] for link in links)
        pipe.hincrby(keys.stats(ns), "links", new_links)
        pipe.hincrby(keys.stats(ns), "insights", sum(w.created for w in writes))
        pipe.execute()
    return len(fresh)


def _still_valid(ctx: WorkerContext, ns: str, draft: Draft) -> bool:
    """Every member is still active, the insight's cluster entry is what was planned on, and
    an insight to update was not deleted meanwhile."""
    plan = draft.plan
    pipe = ctx.redis.pipeline(transaction=False)
    pipe.hget(ctx.keys.clusters(ns), plan.insight_id)
    pipe.hget(ctx.keys.note(ns, plan.insight_id), "status")
    for m in plan.members:
        pipe.hget(ctx.keys.note(ns, m), "status")
    entry, own, *statuses = pipe.execute()
    previous = tuple(msgpack.unpackb(entry, raw=False)) if entry is not None else None
    alive = plan.previous is None or own == b"active"
    return previous == plan.previous and alive and all(s == b"active" for s in statuses)


def _seqs(
    ctx: WorkerContext, ns: str, ids: list[str], existing: Mapping[str, notes.Fields]
) -> dict[str, int]:
    """The seq of each insight: its own when it exists, else a new one."""
    seqs = {nid: int(existing[nid][b"seq"]) for nid in ids if nid in existing}
    fresh = [nid for nid in ids if nid not in existing]
    if fresh:
        last = int(ctx.redis.incrby(ctx.keys.seq(ns), len(fresh)))
        seqs.update({nid: last - len(fresh) + 1 + i for i, nid in enumerate(fresh)})
    return seqs


def _write(
    ctx: WorkerContext,
    ns: str,
    draft: Draft,
    vec: bytes,
    seqs: Mapping[str, int],
    existing: Mapping[str, notes.Fields],
    graph: Graph,
) -> notes.NoteWrite:
    iid, members = draft.plan.insight_id, draft.plan.members
    old = notes.unpack_fields(existing[iid]) if iid in existing else {}
    keywords = extract_keywords(draft.content)
    importances = [float(graph.fields[m]["importance"] or 0.5) for m in members]
    now = time.time()
    fields = {
        "id": iid,
        "namespace": ns,
        "content": draft.content,
        "kind": "insight",
        "keywords": keywords,
        "tags": derive_tags(keywords[:4], [INSIGHT_TAG], max_chars=ctx.settings.max_tag_chars),
        "context": lead_sentence(draft.content),
        "metadata": {"abstracted_from": list(members), "summary": draft.source},
        "agent": None,
        "created_at": old.get("created_at", now),
        "event_time": None,
        "importance": round(sum(importances) / len(importances), 4),
        "access_count": int(old.get("access_count", 0)),
        "last_access": float(old.get("last_access", 0.0)),
        "status": "active",
        "version": int(old.get("version", 0)) + 1,
        "embedder": ctx.embedder.name,
        "seq": seqs[iid],
        "updated_at": now,
    }
    before = notes.public_view(old) if old else None
    return notes.NoteWrite(iid, seqs[iid], fields, vec, created=not old, before=before)


def _audit(
    pipe: Pipeline, ctx: WorkerContext, ns: str, draft: Draft, write: notes.NoteWrite
) -> None:
    after = {
        **notes.public_view(write.fields),
        "links": {m: [INSIGHT_LINK_WEIGHT, "abstracted_from"] for m in draft.plan.members},
    }
    notes.audit(
        pipe,
        ctx.keys,
        ns,
        "create" if write.created else "update",
        draft.plan.insight_id,
        actor="worker",
        source=f"consolidation:{draft.source}",
        before=write.before,
        after=after,
    )
