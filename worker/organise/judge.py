"""The LLM link judge (the second stage of the embedding-plus-LLM memory linking pattern), on
with ``ZQ_JUDGE=llm`` and an LLM URL.

Ingest never waits for it. A batch commits its notes with the heuristic judge's links, so they
are searchable at once, and queues each new (or changed) note's FAISS and same-batch candidates
whose cosine reaches ``judge_min_similarity`` (the cheap pre-filter) on ``Keys.judge``.
``judge_namespace`` then takes up to MAX_NOTES_PER_RUN queued notes and sends the candidates of
``judge_notes_per_call`` of them to one chat call (calls run in parallel up to
``llm_max_concurrent``), outside every lock; fewer notes than that wait for company up to
``judge_max_wait_s``. Each candidate is shown under a number of its own
(``llm.number_items``), so an answer can only name a (note, candidate) pair it was shown.

The model answers which candidates to link and with which relation (``linking.RELATIONS``:
how the new note relates to the candidate). Its answer becomes the note's similarity links:
picked candidates are linked (weight: the cosine, at least ``link_threshold``; label: the
relation; source ``model:<name>``), and links the similarity rule made to shown candidates the
model left out are removed; sequence links and links made by other stages stay. Any failure of
a call (timeout, malformed JSON, an unknown number, budget spent: see ``llm.ask_json``) fails
closed for its group: those notes keep the heuristic's links, the reason is logged and counted
(``llm_fail_<reason>``, ``judge_fallbacks``). Under the namespace lock the run re-checks that
its queue entries are still there, that each note is unchanged since it was queued and that its
candidates are active, then commits in one MULTI/EXEC with one ``link`` audit entry per changed
note, and pops its entries. Stats: ``judge_notes``, ``judge_calls``, ``judge_fallbacks``
beside ``llm_calls`` and the token counters.
"""

from __future__ import annotations

import logging
import string
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, Field
from redis.client import Pipeline

from producer.protocol import link_meta, link_weight
from worker.context import WorkerContext
from worker.organise import llm
from worker.organise.linking import SEQUENCE, Candidate, dedupe_links
from worker.settings import WorkerSettings
from worker.store import degree, notes
from worker.store.lease import Lease
from worker.store.notes import Link

log = logging.getLogger(__name__)

MAX_NOTES_PER_RUN = 256  #: queued notes one namespace run judges; the rest wait for the next
#: Queue entries kept per namespace; past it the oldest are dropped unjudged (those notes keep
#: the heuristic's links), so a judge that never runs cannot grow Redis without bound.
MAX_QUEUED = 100_000
PROMPT_NOTE_CHARS = 400  #: each note's content is cut to this in the prompt
RULE_SOURCES = frozenset({"rule", "rule:similarity"})  #: links the judge may replace
INSTRUCTIONS = (
    "Each new note below comes with candidate notes from the same memory. Decide which "
    "candidates the new note should be linked to: link only notes that are genuinely related "
    "(the same subject, cause and effect, evidence, an example, a revision, a disagreement), "
    "not notes that merely share words. For each link give the relation of the new note to the "
    "candidate: updates (it revises or replaces what the candidate says), contradicts (they "
    "disagree), supports (it gives evidence for the candidate), elaborates (it adds detail to "
    "the candidate), example_of (it is an instance of the candidate), related (none of those "
    'fits). Answer {"links": [{"candidate": <number>, "relation": <relation>}, ...]} naming '
    "candidates by their numbers; leave out the candidates not to link."
)

Relation = Literal["related", "supports", "elaborates", "contradicts", "updates", "example_of"]


class Verdict(BaseModel):
    """One link the model makes: a shown candidate number and the relation."""

    candidate: llm.ShownRef
    relation: Relation


class JudgeAnswer(BaseModel):
    links: list[Verdict] = Field(default_factory=list, max_length=2_000)


@dataclass(frozen=True)
class Request:
    """A queued note: its id, the inbox entry that wrote it, its candidates (id, cosine)."""

    note_id: str
    src: str
    candidates: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Judged:
    """The model's picks (candidate id -> relation) for a request; None when the call failed."""

    request: Request
    picks: dict[str, str] | None


def request(
    note_id: str, src: str, candidates: Sequence[Candidate], s: WorkerSettings
) -> list[bytes]:
    """The packed queue entry for a note (empty when no candidate passes the pre-filter or no
    LLM is configured): its best ``link_k`` candidates at ``judge_min_similarity`` or more."""
    if s.llm_url is None:
        return []
    best: dict[str, float] = {}
    for c in candidates:
        if c.note_id != note_id and c.similarity >= s.judge_min_similarity:
            best[c.note_id] = max(c.similarity, best.get(c.note_id, -1.0))
    top = sorted(best.items(), key=lambda item: (-item[1], item[0]))[: s.link_k]
    if not top:
        return []
    packed = [[cid, round(sim, 4)] for cid, sim in top]
    return [msgpack.packb({"id": note_id, "src": src, "c": packed, "at": time.time()})]


def plan_links(
    judged: Judged,
    active: set[str],
    existing: Mapping[str, tuple[float, dict[str, Any]]],
    threshold: float,
    max_links: int,
    source: str,
) -> tuple[list[Link], list[tuple[str, str]]]:
    """The links a verdict makes and the links (a, b) it removes, given the note's existing
    links (neighbour -> (weight, meta)) and the notes still active. A rewritten link is both
    removed and made."""
    nid, picks = judged.request.note_id, judged.picks or {}
    shown = [(cid, sim) for cid, sim in judged.request.candidates if cid in active]
    ranked = sorted((c for c in shown if c[0] in picks), key=lambda c: (-c[1], c[0]))
    adds: list[Link] = []
    for cid, sim in ranked[:max_links]:
        weight, reason = round(max(sim, threshold), 4), f"judged {picks[cid]}; cosine {sim:.2f}"
        old_weight, meta = existing.get(cid, (0.0, {}))
        if SEQUENCE in str(meta.get("reason", "")):
            weight, reason = max(weight, old_weight), f"{SEQUENCE}; {reason}"
        adds.append(Link(nid, cid, weight, reason, picks[cid], source))
    linked = {link.b for link in adds}
    removes = [(nid, cid) for cid in linked if cid in existing]
    removes += [
        (nid, cid)
        for cid, _ in shown
        if cid not in linked and cid in existing and _by_similarity_rule(existing[cid][1])
    ]
    return adds, removes


def _by_similarity_rule(meta: Mapping[str, Any]) -> bool:
    return meta.get("source") in RULE_SOURCES and SEQUENCE not in str(meta.get("reason", ""))


def judge_namespace(ctx: WorkerContext, ns: str) -> int:
    """Judge up to MAX_NOTES_PER_RUN queued notes of ``ns``; return how many were judged
    (including those that kept the heuristic's links because their call failed)."""
    started = time.perf_counter()
    size = ctx.settings.judge_notes_per_call
    raw = _due(ctx, ctx.redis.lrange(ctx.keys.judge(ns), 0, MAX_NOTES_PER_RUN - 1))
    if not raw:
        return 0
    requests = [_unpack(entry) for entry in raw]
    texts = _texts(ctx, ns, requests)
    live = [r for r in (_live(r, texts) for r in requests) if r is not None]
    groups = [live[i : i + size] for i in range(0, len(live), size)]
    judged: list[Judged] = []
    if groups:
        with ThreadPoolExecutor(min(len(groups), ctx.settings.llm_max_concurrent)) as pool:
            for part in pool.map(lambda g: _ask(ctx, ns, g, texts), groups):
                judged += part
    done = _commit(ctx, ns, raw, judged, len(groups))
    log.info(
        "judged ns=%s notes=%d calls=%d failed=%d in %.1fms",
        ns,
        done,
        len(groups),
        sum(j.picks is None for j in judged),
        (time.perf_counter() - started) * 1000,
    )
    return done


def _due(ctx: WorkerContext, raw: list[bytes]) -> list[bytes]:
    """The queue entries to judge now: whole groups of ``judge_notes_per_call``, and the rest
    too once its oldest entry has waited ``judge_max_wait_s`` (so calls stay well below one
    per note while notes trickle in)."""
    whole = len(raw) - len(raw) % ctx.settings.judge_notes_per_call
    if whole == len(raw):
        return raw
    queued_at = float(msgpack.unpackb(raw[whole], raw=False).get("at", 0.0))
    return raw if time.time() - queued_at >= ctx.settings.judge_max_wait_s else raw[:whole]


def _unpack(raw: bytes) -> Request:
    data = msgpack.unpackb(raw, raw=False)
    cands = tuple((str(cid), float(sim)) for cid, sim in data["c"])
    return Request(str(data["id"]), str(data["src"]), cands)


def _texts(ctx: WorkerContext, ns: str, requests: list[Request]) -> dict[str, list[bytes | None]]:
    """[status, src, content] of every note and candidate the requests name (one round trip)."""
    ids = sorted({r.note_id for r in requests} | {c for r in requests for c, _ in r.candidates})
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hmget(ctx.keys.note(ns, nid), ["status", "src", "content"])
    return dict(zip(ids, pipe.execute(), strict=True))


def _live(req: Request, texts: Mapping[str, list[bytes | None]]) -> Request | None:
    """The request with its active candidates, or None when the note changed or went away."""
    status, src, _ = texts[req.note_id]
    if status != b"active" or src is None or src.decode() != req.src:
        return None
    cands = tuple((cid, sim) for cid, sim in req.candidates if texts[cid][0] == b"active")
    return Request(req.note_id, req.src, cands) if cands else None


def _ask(
    ctx: WorkerContext, ns: str, group: list[Request], texts: Mapping[str, list[bytes | None]]
) -> list[Judged]:
    """One chat call for a group of notes; every candidate shown under its own number."""
    pairs: list[tuple[str, str]] = []
    lines = [INSTRUCTIONS]
    for letter, req in zip(string.ascii_uppercase, group, strict=False):
        lines += ["", f"New note {letter}: {_text(texts, req.note_id)}"]
        lines.append(f"Candidates for {letter}:")
        for cid, _ in req.candidates:
            pairs.append((req.note_id, cid))
            lines.append(f"[{len(pairs)}] {_text(texts, cid)}")
    shown = llm.number_items([f"{nid} {cid}" for nid, cid in pairs])
    answer = llm.ask_json(ctx, ns, "\n".join(lines), JudgeAnswer, shown=shown)
    if answer is None:
        return [Judged(req, None) for req in group]
    picks: dict[str, dict[str, str]] = {req.note_id: {} for req in group}
    for verdict in answer.links:
        nid, cid = pairs[verdict.candidate - 1]
        picks[nid].setdefault(cid, verdict.relation)
    return [Judged(req, picks[req.note_id]) for req in group]


def _text(texts: Mapping[str, list[bytes | None]], nid: str) -> str:
    content = texts[nid][2] or b""
    return " ".join(content.decode().split())[:PROMPT_NOTE_CHARS]


def _commit(ctx: WorkerContext, ns: str, raw: list[bytes], judged: list[Judged], calls: int) -> int:
    """Under the namespace lock: re-check, apply the verdicts, pop the entries judged."""
    keys, s = ctx.keys, ctx.settings
    source = f"model:{s.llm_model}"
    with Lease(ctx.redis, keys.lock(ns), s.lease_s, owner=ctx.consumer) as lease, lease.kept():
        if ctx.redis.lrange(keys.judge(ns), 0, len(raw) - 1) != raw:
            return 0  # another run judged these entries meanwhile
        ok = [j for j in judged if j.picks is not None]
        unchanged, active, existing = _current(ctx, ns, ok)
        plans = {
            j.request.note_id: plan_links(
                j, active, existing[j.request.note_id], s.link_threshold, s.max_links, source
            )
            for j in ok
            if j.request.note_id in unchanged
        }
        adds = dedupe_links([link for new, _ in plans.values() for link in new])
        removes = sorted({_pair(*pair) for _, gone in plans.values() for pair in gone})
        capped = degree.plan_cap(ctx, ns, adds, removes)
        with lease.fenced() as pipe:
            notes.changed(pipe, keys, ns)
            notes.unlink_pairs(pipe, keys, ns, removes)
            notes.write_links(pipe, keys, ns, capped.links, source=source)
            degree.apply_cap(pipe, ctx, ns, capped, actor="worker")
            _audit(pipe, ctx, ns, plans, capped.links, existing, source)
            pipe.ltrim(keys.judge(ns), len(raw), -1)
            stats = keys.stats(ns)
            pipe.hincrby(stats, "links", len(capped.links) - len(removes))
            pipe.hincrby(stats, "judge_notes", len(judged))
            pipe.hincrby(stats, "judge_calls", calls)
            pipe.hincrby(stats, "judge_fallbacks", len(judged) - len(ok))
            pipe.hset(stats, "last_judge", time.time())
            pipe.execute()
    return len(judged)


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def _current(
    ctx: WorkerContext, ns: str, judged: list[Judged]
) -> tuple[set[str], set[str], dict[str, dict[str, tuple[float, dict[str, Any]]]]]:
    """The judged notes still active and unchanged since queued, the candidates still active,
    and each judged note's links with their metas, read under the lock."""
    ids = sorted({j.request.note_id for j in judged})
    cands = sorted({c for j in judged for c, _ in j.request.candidates})
    srcs = {j.request.note_id: j.request.src.encode() for j in judged}
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hmget(ctx.keys.note(ns, nid), ["status", "src"])
        pipe.hgetall(ctx.keys.links(ns, nid))
    for cid in cands:
        pipe.hget(ctx.keys.note(ns, cid), "status")
    rows = iter(pipe.execute())
    unchanged: set[str] = set()
    existing: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}
    for nid in ids:
        (status, src), links = next(rows), next(rows)
        if status == b"active" and src == srcs[nid]:
            unchanged.add(nid)
        existing[nid] = {m.decode(): (link_weight(raw), link_meta(raw)) for m, raw in links.items()}
    active = {cid for cid in cands if next(rows) == b"active"}
    return unchanged, active, existing


def _audit(
    pipe: Pipeline,
    ctx: WorkerContext,
    ns: str,
    plans: Mapping[str, tuple[list[Link], list[tuple[str, str]]]],
    written: list[Link],
    existing: Mapping[str, Mapping[str, tuple[float, dict[str, Any]]]],
    source: str,
) -> None:
    """One ``link`` entry per note whose links the verdict changed: the links before and
    after, for the neighbours it touched."""
    made: dict[str, dict[str, list[Any]]] = {}
    for link in written:
        made.setdefault(link.a, {})[link.b] = [link.weight, link.reason, link.label]
        made.setdefault(link.b, {})[link.a] = [link.weight, link.reason, link.label]
    for nid, (_, removes) in plans.items():
        after = made.get(nid, {})
        touched = {b for _, b in removes} | set(after)
        if not touched:
            continue
        old = existing[nid]
        before = {
            b: [old[b][0], old[b][1].get("reason", ""), old[b][1].get("label", "")]
            for b in sorted(touched)
            if b in old
        }
        notes.audit(
            pipe,
            ctx.keys,
            ns,
            "link",
            nid,
            actor="worker",
            source=f"judge:{source}",
            before={"links": before},
            after={"links": after},
        )
