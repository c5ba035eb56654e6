"""Evolution (A-MEM, without the flaws the Agent Memory Atlas review of it lists): when a new
note links to neighbours, the neighbours' tags and context may change to reflect it. Off by
default (``ZQ_EVOLUTION``).

Triggers. ``evolve_namespace`` reads the namespace's audit stream from where its last run
stopped (``Keys.evolved``): every create/update entry that made links names a trigger note and
the inbox entry that wrote it (the proposal's batch); a run takes at most MAX_TRIGGERS of them.
A trigger's neighbours are its MAX_NEIGHBOURS strongest current topical links (structural ones
such as "sequence" or "abstracted_from" say nothing about subject); a neighbour reached from
several triggers is considered once, with all of them.

Proposals. Each neighbour gets at most one, which only ever adds tags (a caller's tags stay, and
tags a reviewer rejected or reverted for it are never proposed again) and may set a one-line
context:
- rule (the default), at most MAX_NEW_TAGS tags, each for a stated reason:
  - "shared": a keyword the neighbour shares with its triggers that is rare in the namespace
    (IDF at least ``link_min_shared_idf``, the linker's own bar) and not yet one of its tags;
  - "consensus": a tag carried by at least QUORUM of the neighbour's CONSENSUS_SAMPLE strongest
    topical neighbours, and by at least MIN_SUPPORT of them.
  The rule sets no context.
- model (when ``ZQ_LLM_URL`` is set): one call per LLM_BATCH neighbours shows the triggers and
  the numbered neighbours and asks which tags to add and which context to set; an answer is
  mapped back through the numbers shown only (``llm.ShownRef``), and any failure proposes
  nothing for that call (fail closed; ``llm`` counts it).
Keywords are not evolved: they derive from the content and are the linker's evidence, held in
every worker's projection.

Commit (``worker.organise.proposals``). Under the namespace lock each neighbour is read again; one
written since it was read, no longer active, or with a pending proposal already is skipped, so
evolution never overwrites what ingest wrote meanwhile. The rest become proposals in one fenced
MULTI/EXEC with their audit entries and the advanced audit cursor: applied at once in "apply"
mode, pending in "propose" mode. The LLM calls and the reads happen before, outside the lock.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgpack
from pydantic import BaseModel, Field, StringConstraints, model_validator

from producer import validation
from producer.errors import InvalidInput
from producer.proposals import decode_value
from producer.protocol import link_weight
from worker.context import WorkerContext
from worker.index.lexical import RARITY_PSEUDO_DOCS, stem
from worker.index.projection import catch_up
from worker.organise import llm
from worker.organise.consolidation import STRUCTURAL_REASONS
from worker.organise.proposals import SNAPSHOT, Draft, Raw, commit_drafts, expire_settled
from worker.store.graph import link_reason

log = logging.getLogger(__name__)

MAX_AUDIT_PER_RUN = 2_000  #: audit entries one run reads at most
MAX_TRIGGERS = 64  #: trigger notes one run evolves around at most
MAX_NEIGHBOURS = 4  #: strongest topical neighbours of a trigger that may evolve
CONSENSUS_SAMPLE = 16  #: strongest topical neighbours whose tags vote on a note's tags
MIN_SUPPORT = 2  #: neighbours that must carry a tag before it spreads
QUORUM = 2 / 3  #: share of the voting neighbours that must carry it
MAX_NEW_TAGS = 3  #: tags one proposal adds at most
LLM_BATCH = 16  #: neighbours shown per LLM call
CONTEXT_MAX_CHARS = 300  #: longest context the model may set
PROMPT_NOTE_CHARS = 400  #: each note's content is cut to this in a prompt
TRIGGER_OPS = frozenset({"create", "update"})  #: audit ops whose links can trigger evolution
READ = (*SNAPSHOT, "status", "keywords", "content")  #: fields read of every note involved


@dataclass
class Round:
    """What one run works on: triggers (id -> batch), neighbours (id -> their triggers), the
    READ fields of every active note among them, and the tags refused for each neighbour."""

    triggers: dict[str, list[str]]
    neighbours: dict[str, list[str]]
    fields: dict[str, Raw]
    refused: dict[str, set[str]]  #: tags reviewers refused, per neighbour

    def batch(self, triggers: Iterable[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(src for t in triggers for src in self.triggers[t]))

    def decoded(self, nid: str, name: str) -> Any:
        return decode_value(name, self.fields[nid][name])


Tag = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64)]


class NeighbourChange(BaseModel):
    """The model's change to one shown note."""

    note: llm.ShownRef
    add_tags: list[Tag] = Field(default_factory=list, max_length=MAX_NEW_TAGS)
    context: str | None = Field(default=None, max_length=CONTEXT_MAX_CHARS)


class EvolutionAnswer(BaseModel):
    """What the LLM answers for one batch of neighbours: changes to some of them."""

    changes: list[NeighbourChange] = Field(default_factory=list, max_length=LLM_BATCH)

    @model_validator(mode="after")
    def _one_change_per_note(self) -> EvolutionAnswer:
        numbers = [c.note for c in self.changes]
        if len(set(numbers)) != len(numbers):
            raise ValueError("a note is changed twice")
        return self


def read_triggers(
    entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]], limit: int = MAX_TRIGGERS
) -> tuple[dict[str, list[str]], bytes | None]:
    """Trigger note -> the audit sources (inbox entries) that linked it, from audit entries in
    order, stopping before a trigger past ``limit``; and the id of the last entry taken (the
    cursor of the next run)."""
    triggers: dict[str, list[str]] = {}
    last: bytes | None = None
    for entry_id, f in entries:
        nid = f.get(b"id", b"").decode()
        if _links_made(f):
            if nid not in triggers and len(triggers) >= limit:
                break
            sources = triggers.setdefault(nid, [])
            source = f.get(b"source", b"").decode()
            if source not in sources:
                sources.append(source)
        last = entry_id
    return triggers, last


def _links_made(f: Mapping[bytes, bytes]) -> bool:
    """Whether an audit entry is a create/update that made links."""
    if f.get(b"op", b"").decode() not in TRIGGER_OPS:
        return False
    after = msgpack.unpackb(f[b"after"], raw=False) if b"after" in f else None
    return isinstance(after, dict) and bool(after.get("links"))


def rare_shared(
    keywords: Sequence[str],
    trigger_keywords: Iterable[str],
    tags: Sequence[str],
    rarity: Mapping[str, float],
    min_idf: float,
) -> list[str]:
    """Keywords a note shares with its triggers, rare enough and not yet its tags, rarest first."""
    shared = set(keywords) & set(trigger_keywords)
    picked = [kw for kw in shared if kw not in tags and rarity.get(kw, 0.0) >= min_idf]
    return sorted(picked, key=lambda kw: (-rarity.get(kw, 0.0), kw))


def consensus_tags(
    tags: Sequence[str],
    neighbour_tags: Sequence[Sequence[str]],
    min_support: int = MIN_SUPPORT,
    quorum: float = QUORUM,
) -> list[tuple[str, int]]:
    """(tag, carriers) for each tag the note lacks that at least ``quorum`` of its neighbours,
    and at least ``min_support`` of them, carry; best supported first."""
    counts = Counter(t for carried in neighbour_tags for t in set(carried))
    need = max(min_support, math.ceil(quorum * len(neighbour_tags) - 1e-9))
    agreed = [(t, c) for t, c in counts.items() if c >= need and t not in tags]
    return sorted(agreed, key=lambda item: (-item[1], item[0]))


def added_tags(
    tags: Sequence[str], candidates: Iterable[str], max_new: int, max_tags: int
) -> list[str]:
    """The candidates not in ``tags``, at most ``max_new`` and ``max_tags`` - len(tags)."""
    room = max(0, min(max_new, max_tags - len(tags)))
    return [t for t in dict.fromkeys(candidates) if t not in tags][:room]


def rule_change(
    tags: Sequence[str],
    shared: Sequence[str],
    agreed: Sequence[tuple[str, int]],
    voters: int,
    max_tags: int,
) -> tuple[list[str], str] | None:
    """The rule's new tag list and its reason, or None when it adds nothing."""
    new = added_tags(tags, [*shared, *(t for t, _ in agreed)], MAX_NEW_TAGS, max_tags)
    if not new:
        return None
    support = dict(agreed)
    reasons = [
        f"shared rare keyword {t}" if t in shared else f"{t} on {support[t]} of {voters} neighbours"
        for t in new
    ]
    return [*tags, *new], "; ".join(reasons)


def evolve_namespace(ctx: WorkerContext, ns: str) -> int:
    """Evolve the neighbours of the notes linked since the last run (at most MAX_TRIGGERS of
    them), after deleting the settled proposals past their retention; return how many
    proposals were made (applied or pending) plus how many were deleted. Nothing is proposed
    when evolution is off."""
    validation.check_namespace(ns)
    expired = expire_settled(ctx, ns, time.time())
    mode = ctx.settings.evolution
    if mode == "off":
        return expired
    started = time.perf_counter()
    now = time.time()
    cursor = ctx.redis.get(ctx.keys.evolved(ns))
    start = b"(" + cursor if cursor else "-"
    entries = ctx.redis.xrange(ctx.keys.audit(ns), min=start, count=MAX_AUDIT_PER_RUN)
    triggers, last = read_triggers(entries)
    drafts = _drafts(ctx, ns, triggers) if triggers else []
    written = commit_drafts(ctx, ns, drafts, last, mode) if last is not None else 0
    if last is None or (len(entries) < MAX_AUDIT_PER_RUN and last == entries[-1][0]):
        ctx.redis.hset(ctx.keys.stats(ns), "last_evolve", now)
    log.info(
        "evolved ns=%s mode=%s triggers=%d drafts=%d written=%d expired=%d in %.1fms",
        ns,
        mode,
        len(triggers),
        len(drafts),
        written,
        expired,
        (time.perf_counter() - started) * 1000,
    )
    return written + expired


def _drafts(ctx: WorkerContext, ns: str, triggers: dict[str, list[str]]) -> list[Draft]:
    links = _topical(ctx, ns, list(triggers), MAX_NEIGHBOURS)
    neighbours: dict[str, list[str]] = {}
    for trigger, row in links.items():
        for nb, _ in row:
            neighbours.setdefault(nb, []).append(trigger)
    fields = _read(ctx, ns, [*neighbours, *triggers])
    active = {nb: ts for nb, ts in neighbours.items() if nb in fields}
    if not active:
        return []
    work = Round(triggers, active, fields, _refused(ctx, ns, list(active)))
    if ctx.settings.llm_url is not None:
        return _model_drafts(ctx, ns, work)
    return _rule_drafts(ctx, ns, work)


def _topical(
    ctx: WorkerContext, ns: str, ids: Sequence[str], limit: int
) -> dict[str, list[tuple[str, float]]]:
    """Each note's ``limit`` strongest links whose reason is topical, strongest first."""
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hgetall(ctx.keys.links(ns, nid))
    out: dict[str, list[tuple[str, float]]] = {}
    for nid, row in zip(ids, pipe.execute(), strict=True):
        strongest = sorted(((link_weight(raw), nb, raw) for nb, raw in row.items()), reverse=True)
        topical = [
            (nb.decode(), w)
            for w, nb, raw in strongest[: 4 * limit]
            if link_reason(raw) not in STRUCTURAL_REASONS
        ]
        out[nid] = topical[:limit]
    return out


def _read(
    ctx: WorkerContext, ns: str, ids: Sequence[str], names: Sequence[str] = READ
) -> dict[str, Raw]:
    """The fields ``names`` (which include status) of each id that is an active note."""
    unique = list(dict.fromkeys(ids))
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in unique:
        pipe.hmget(ctx.keys.note(ns, nid), list(names))
    rows = [dict(zip(names, row, strict=True)) for row in pipe.execute()]
    return {nid: row for nid, row in zip(unique, rows, strict=True) if row["status"] == b"active"}


def _refused(ctx: WorkerContext, ns: str, ids: list[str]) -> dict[str, set[str]]:
    rows = ctx.redis.hmget(ctx.keys.refused(ns), ids)
    return {nid: set(msgpack.unpackb(row)) for nid, row in zip(ids, rows, strict=True) if row}


def _rule_drafts(ctx: WorkerContext, ns: str, work: Round) -> list[Draft]:
    s = ctx.settings
    sample = _topical(ctx, ns, list(work.neighbours), CONSENSUS_SAMPLE)
    voters = _read(ctx, ns, [v for row in sample.values() for v, _ in row], ("tags", "status"))
    words = {kw for nid in work.fields for kw in work.decoded(nid, "keywords") or []}
    rarity = _rarity(ctx, ns, words)
    drafts = []
    for nb, triggers in work.neighbours.items():
        tags = work.decoded(nb, "tags") or []
        trigger_words = [kw for t in triggers if t in work.fields for kw in _keywords(work, t)]
        shared = rare_shared(
            _keywords(work, nb), trigger_words, tags, rarity, s.link_min_shared_idf
        )
        votes = [
            decode_value("tags", voters[v]["tags"]) or [] for v, _ in sample[nb] if v in voters
        ]
        refused = work.refused.get(nb, set())
        agreed = [(t, c) for t, c in consensus_tags(tags, votes) if t not in refused]
        offered = [t for t in shared if t not in refused and len(t) <= s.max_tag_chars]
        change = rule_change(tags, offered, agreed, len(votes), s.max_tags)
        if change is not None:
            after = {"tags": change[0]}
            drafts.append(_draft(work, nb, after, "rule", change[1], triggers))
    return drafts


def _keywords(work: Round, nid: str) -> list[str]:
    return list(work.decoded(nid, "keywords") or [])


def _rarity(ctx: WorkerContext, ns: str, words: set[str]) -> dict[str, float]:
    """Each keyword's IDF in this process's projection of ``ns`` (caught up first)."""
    proj = ctx.projection(ns)
    with proj.lock:
        catch_up(ctx, proj)
        return {kw: proj.lexical.idf(stem(kw), RARITY_PSEUDO_DOCS) for kw in words}


def _draft(
    work: Round, nid: str, after: dict[str, Any], source: str, reason: str, triggers: list[str]
) -> Draft:
    raw = {name: work.fields[nid][name] for name in SNAPSHOT}
    return Draft(nid, raw, after, source, reason, tuple(triggers), work.batch(triggers))


def _model_drafts(ctx: WorkerContext, ns: str, work: Round) -> list[Draft]:
    """One LLM call per LLM_BATCH neighbours; a failed call proposes nothing."""
    drafts: list[Draft] = []
    ids = list(work.neighbours)
    for start in range(0, len(ids), LLM_BATCH):
        shown = llm.number_items(ids[start : start + LLM_BATCH])
        answer = llm.ask_json(ctx, ns, _prompt(work, shown), EvolutionAnswer, shown=shown)
        for change in answer.changes if answer is not None else []:
            draft = _model_draft(ctx, work, shown[change.note], change)
            if draft is not None:
                drafts.append(draft)
    return drafts


def _model_draft(
    ctx: WorkerContext, work: Round, nid: str, change: NeighbourChange
) -> Draft | None:
    s = ctx.settings
    tags = work.decoded(nid, "tags") or []
    after: dict[str, Any] = {}
    offered = [t for t in change.add_tags if t not in work.refused.get(nid, set())]
    new = added_tags(tags, offered, MAX_NEW_TAGS, s.max_tags)
    try:
        validation.check_tags(new, MAX_NEW_TAGS, s.max_tag_chars)
    except InvalidInput as exc:
        log.warning("evolution: model tags for note=%s refused: %s", nid, exc)
        return None
    if new:
        after["tags"] = [*tags, *new]
    context = " ".join((change.context or "").split())
    if context and context != work.decoded(nid, "context"):
        after["context"] = context
    if not after:
        return None
    source = f"model:{s.llm_model}"
    return _draft(work, nid, after, source, "proposed by the model", work.neighbours[nid])


def _prompt(work: Round, shown: Mapping[int, str]) -> str:
    triggers = list(dict.fromkeys(t for nid in shown.values() for t in work.neighbours[nid]))
    label = {t: f"N{i}" for i, t in enumerate(triggers, start=1)}
    lines = [
        "New notes were just linked to the existing notes below. For each existing note that "
        f"the new evidence should change, give its number, up to {MAX_NEW_TAGS} tags to add "
        f"and, if useful, a one-line context (what the note is about, at most "
        f"{CONTEXT_MAX_CHARS} characters). Leave out notes that need no change.",
        "",
        "New notes:",
    ]
    lines += [f"{label[t]}: {_content(work, t)}" for t in triggers]
    lines += ["", "Existing notes:"]
    for n, nid in shown.items():
        tags = ", ".join(work.decoded(nid, "tags") or [])
        linked = ", ".join(label[t] for t in work.neighbours[nid])
        lines.append(
            f"[{n}] linked to {linked}; tags: {tags}; context: {work.decoded(nid, 'context') or ''}"
        )
        lines.append(f"    {_content(work, nid)}")
    return "\n".join(lines)


def _content(work: Round, nid: str) -> str:
    if nid not in work.fields:
        return "(no longer active)"
    return str(work.decoded(nid, "content") or "")[:PROMPT_NOTE_CHARS]
