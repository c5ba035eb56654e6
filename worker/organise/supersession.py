"""Supersession (bi-temporal): a newer note that updates an older one closes the older one's
validity instead of deleting it.

The older note gets ``valid_to`` (the newer note's event_time, else its creation time) and
``superseded_by`` (the newer note's id), and the pair is linked on both sides: reason
``superseded_by`` on the older note's side, ``supersedes`` on the newer one's, each with the
evidence (``why``) and the source (``rule`` or ``model:<name>``). Search ranks notes still valid
first and ``as_of`` sees the older note again. Each supersession is audited (op ``supersede``,
before/after of both fields and of the link) and ``revert_supersession`` undoes it exactly.

Two judges look at a pair (a newer note and one of its NEAREST_K nearest older notes, cosine
at least ``supersede_min_cosine``, or for the rule one of the notes BM25 ranks best for the
change's subject and old value; both plain notes, the older one still valid):

- the rule (worker.organise.supersession_rule: explicit change markers only) runs on each ingest
  batch (``on_ingest``, only for the notes with a change marker, under the batch's namespace lock)
  and in ``supersede_namespace``;
- the LLM (when ``llm_url`` is set; in ``supersede_namespace`` only, never under the ingest
  lock) sees up to ``supersede_llm_batch`` new notes per call, each with its numbered nearest
  older notes, and names the pairs where the newer note makes the older one no longer true. Any
  failure, or a pair it was not shown together, fails closed: nothing is superseded.

``supersede_namespace`` visits the notes created since its last run (a seq cursor in stats).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgpack
from pydantic import BaseModel, Field
from redis.client import Pipeline

from producer.protocol import pack_link, unpack_link
from worker.context import WorkerContext
from worker.index.lexical import analyze
from worker.organise import llm, pairs
from worker.organise.pairs import Text
from worker.organise.supersession_rule import Change, change_of, eligible, judge_pair
from worker.store import notes
from worker.store.lease import Lease

log = logging.getLogger(__name__)

LINK_WEIGHT = 0.5  #: weight of a supersession link (a stronger existing link keeps its weight)
OLD_SIDE = "superseded_by"  #: link reason on the older note's side
NEW_SIDE = "supersedes"  #: link reason on the newer note's side
MAX_NEW_PER_RUN = 500  #: new notes supersede_namespace looks at per run
NEAREST_K = 10  #: nearest notes each new note is judged against
LLM_CANDIDATES = 3  #: older notes shown to the LLM per new note
PROMPT_NOTE_CHARS = 400  #: each note's content is cut to this in a prompt
CURSOR = "supersede_seq"  #: stats field: the highest seq supersede_namespace has looked at
AUDIT_CHUNK = 1_000  #: audit entries read per round trip while looking for a supersession


@dataclass(frozen=True)
class Decision:
    """``new_id`` supersedes ``old_id``; ``why`` is the evidence, ``source`` rule or model."""

    old_id: str
    new_id: str
    why: str
    source: str


def judge_rule(
    news: Sequence[Text], near: dict[str, list[str]], texts: dict[str, Text]
) -> list[Decision]:
    """The rule over each new note and its candidates."""
    out: list[Decision] = []
    for new in news:
        for nb in near.get(new.id, []):
            old = texts.get(nb)
            why = judge_pair(new, old) if old is not None else None
            if why is not None and old is not None:
                out.append(Decision(old.id, new.id, why, "rule"))
    return out


class Pair(BaseModel):
    """One supersession the LLM names: new note number, older note number, why."""

    new: llm.ShownRef
    old: llm.ShownRef
    why: str = Field(min_length=1, max_length=200)


class SupersedeAnswer(BaseModel):
    supersessions: list[Pair] = Field(max_length=64)


def _prompt(groups: list[tuple[int, Text, list[tuple[int, Text]]]]) -> str:
    lines = [
        "Each NEW note below is followed by OLDER notes. Name a pair only when the new note "
        "updates or contradicts the older note so that what the older note states is no "
        "longer true (a change of decision, value or state). Related or complementary notes "
        "are not superseded. Answer with the pairs, possibly none.",
    ]
    for n, new, olds in groups:
        lines.append(f"\nNEW [{n}] ({_date(new.at)}) {new.content[:PROMPT_NOTE_CHARS]}")
        lines += [
            f"  OLDER [{m}] ({_date(old.at)}) {old.content[:PROMPT_NOTE_CHARS]}" for m, old in olds
        ]
    return "\n".join(lines)


def _date(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M")


def judge_llm(
    ctx: WorkerContext,
    ns: str,
    news: Sequence[Text],
    near: dict[str, list[tuple[str, float]]],
    texts: dict[str, Text],
) -> list[Decision]:
    """The LLM's decisions, in batches of supersede_llm_batch new notes; a batch whose answer
    fails (or pairs notes it did not show together) decides nothing."""
    todo = []
    for new in news:
        olds = [texts[nb] for nb, _ in near.get(new.id, []) if nb in texts]
        olds = [old for old in olds if eligible(new, old)][:LLM_CANDIDATES]
        if olds:
            todo.append((new, olds))
    size = ctx.settings.supersede_llm_batch
    out: list[Decision] = []
    for start in range(0, len(todo), size):
        out += _ask(ctx, ns, todo[start : start + size])
    return out


def _ask(ctx: WorkerContext, ns: str, todo: list[tuple[Text, list[Text]]]) -> list[Decision]:
    numbers: dict[int, str] = {}
    groups: list[tuple[int, Text, list[tuple[int, Text]]]] = []
    allowed: set[tuple[int, int]] = set()
    for new, olds in todo:
        n = len(numbers) + 1
        numbers[n] = new.id
        shown = []
        for old in olds:
            m = len(numbers) + 1
            numbers[m] = old.id
            shown.append((m, old))
            allowed.add((n, m))
        groups.append((n, new, shown))
    answer = llm.ask_json(ctx, ns, _prompt(groups), SupersedeAnswer, shown=numbers)
    if answer is None:
        return []
    if any((p.new, p.old) not in allowed for p in answer.supersessions):
        log.warning("llm supersession answer pairs notes it was not shown together ns=%s", ns)
        ctx.redis.hincrby(ctx.keys.stats(ns), "llm_failures", 1)
        ctx.redis.hincrby(ctx.keys.stats(ns), "llm_fail_unknown_id", 1)
        return []
    source = f"model:{ctx.settings.llm_model}"
    return [Decision(numbers[p.old], numbers[p.new], p.why, source) for p in answer.supersessions]


def on_ingest(ctx: WorkerContext, lease: Lease, ns: str, contents: dict[str, str]) -> int:
    """The rule over a just-committed batch (id -> content), under its namespace lock; only
    notes with a change marker are looked at. Returns how many notes were superseded."""
    if not ctx.settings.supersede:
        return 0
    changes = {nid: change_of(content) for nid, content in contents.items()}
    marked = {nid: found for nid, found in changes.items() if found}
    if not marked:
        return 0
    near = pairs.nearest(ctx, ns, list(marked), NEAREST_K, ctx.settings.supersede_min_cosine)
    rule_near = _rule_candidates(ctx, ns, marked, near)
    texts = pairs.read_texts(ctx, ns, [*marked, *(nb for row in rule_near.values() for nb in row)])
    news = [texts[nid] for nid in marked if nid in texts]
    return apply(ctx, ns, lease, judge_rule(news, rule_near, texts))


def _rule_candidates(
    ctx: WorkerContext,
    ns: str,
    changes: dict[str, list[Change]],
    near: dict[str, list[tuple[str, float]]],
) -> dict[str, list[str]]:
    """The rule's candidates: each note's nearest notes and the notes BM25 ranks best for the
    subject and old value of its changes (an older note about the same subject may be far in
    the embedding space of a busy namespace)."""
    queries = {
        nid: analyze(" ".join(w for c in found for w in (c.subject, c.old) if w))
        for nid, found in changes.items()
    }
    by_words = pairs.lexical(ctx, ns, queries, NEAREST_K)
    return {
        nid: list(dict.fromkeys([*(nb for nb, _ in near.get(nid, [])), *by_words.get(nid, [])]))
        for nid in changes
    }


def supersede_namespace(ctx: WorkerContext, ns: str) -> int:
    """Judge the notes created since the last run (rule, then the LLM when configured);
    return how many notes were superseded."""
    s = ctx.settings
    if not s.supersede:
        return 0
    started = time.perf_counter()
    fresh = pairs.new_since(ctx, ns, CURSOR, MAX_NEW_PER_RUN)
    done = 0
    if fresh:
        ids = [nid for nid, _ in fresh]
        near = pairs.nearest(ctx, ns, ids, NEAREST_K, s.supersede_min_cosine)
        texts = pairs.read_texts(ctx, ns, ids)
        changes = {nid: change_of(t.content) for nid, t in texts.items()}
        rule_near = _rule_candidates(ctx, ns, {n: c for n, c in changes.items() if c}, near)
        seen = [nb for row in near.values() for nb, _ in row]
        texts |= pairs.read_texts(
            ctx, ns, [*seen, *(nb for row in rule_near.values() for nb in row)]
        )
        news = [texts[nid] for nid in ids if nid in texts]
        decided = judge_rule(news, rule_near, texts)
        if s.llm_url is not None:
            left = [t for t in news if t.id not in {d.new_id for d in decided}]
            decided += judge_llm(ctx, ns, left, near, texts)
        with (
            Lease(ctx.redis, ctx.keys.lock(ns), s.lease_s, owner=ctx.consumer) as lease,
            lease.kept(),
        ):
            done = apply(ctx, ns, lease, decided)
        ctx.redis.hset(ctx.keys.stats(ns), CURSOR, max(seq for _, seq in fresh))
    ctx.redis.hset(ctx.keys.stats(ns), "last_supersede", time.time())
    log.info(
        "supersession ns=%s looked_at=%d superseded=%d in %.1fms",
        ns,
        len(fresh),
        done,
        (time.perf_counter() - started) * 1000,
    )
    return done


def apply(ctx: WorkerContext, ns: str, lease: Lease, decisions: Sequence[Decision]) -> int:
    """Commit the decisions that still hold on the notes re-read under the lock (the rule's are
    judged again) in one fenced MULTI/EXEC; an older note superseded by several new ones takes
    the earliest. Returns how many."""
    if not decisions:
        return 0
    texts = pairs.read_texts(ctx, ns, [i for d in decisions for i in (d.old_id, d.new_id)])
    valid = [d for d in decisions if d.old_id in texts and d.new_id in texts]
    chosen: dict[str, Decision] = {}
    for d in sorted(valid, key=lambda d: (texts[d.new_id].at, texts[d.new_id].created_at)):
        new, old = texts[d.new_id], texts[d.old_id]
        holds = judge_pair(new, old) is not None if d.source == "rule" else eligible(new, old)
        if d.old_id not in chosen and holds:
            chosen[d.old_id] = d
    ready = list(chosen.values())
    if not ready:
        return 0
    links = _current_links(ctx, ns, ready)
    with lease.fenced() as pipe:
        for d in ready:
            _write(pipe, ctx, ns, d, texts[d.new_id].at, links[d.old_id])
        notes.changed(pipe, ctx.keys, ns)
        pipe.hincrby(ctx.keys.stats(ns), "links", sum(1 for d in ready if links[d.old_id] is None))
        pipe.hincrby(ctx.keys.stats(ns), "superseded", len(ready))
        pipe.execute()
    for d in ready:
        log.info(
            "superseded ns=%s old=%s new=%s by=%s (%s)", ns, d.old_id, d.new_id, d.source, d.why
        )
    return len(ready)


LinkState = list[Any] | None  #: [weight, old side meta, new side meta] or None when unlinked


def _current_links(ctx: WorkerContext, ns: str, ready: Sequence[Decision]) -> dict[str, LinkState]:
    keys = ctx.keys
    pipe = ctx.redis.pipeline(transaction=False)
    for d in ready:
        pipe.hget(keys.links(ns, d.old_id), d.new_id)
        pipe.hget(keys.links(ns, d.new_id), d.old_id)
    rows = pipe.execute()
    out: dict[str, LinkState] = {}
    for i, d in enumerate(ready):
        old_end, new_end = rows[2 * i : 2 * i + 2]
        if old_end is None:
            out[d.old_id] = None
            continue
        weight, old_meta = unpack_link(old_end)
        out[d.old_id] = [weight, old_meta, unpack_link(new_end)[1] if new_end else {}]
    return out


def _write(
    pipe: Pipeline, ctx: WorkerContext, ns: str, d: Decision, valid_to: float, before: LinkState
) -> None:
    keys = ctx.keys
    weight = max(LINK_WEIGHT, before[0] if before else 0.0)
    now = time.time()
    old_meta = {"reason": OLD_SIDE, "why": d.why, "source": d.source, "at": now}
    new_meta = {**old_meta, "reason": NEW_SIDE}
    pipe.hset(
        keys.note(ns, d.old_id),
        mapping={"valid_to": msgpack.packb(valid_to), "superseded_by": d.new_id, "updated_at": now},
    )
    _link(pipe, ctx, ns, d.old_id, d.new_id, [weight, old_meta, new_meta])
    notes.audit(
        pipe,
        keys,
        ns,
        "supersede",
        d.old_id,
        actor="worker",
        source=f"supersession:{d.source}",
        before={"valid_to": None, "superseded_by": None, "link": before},
        after={
            "valid_to": valid_to,
            "superseded_by": d.new_id,
            "link": [weight, old_meta, new_meta],
        },
    )


def revert_supersession(ctx: WorkerContext, ns: str, old_id: str) -> bool:
    """Undo the last supersession of ``old_id`` as its audit entry recorded it: ``valid_to``
    and ``superseded_by`` cleared, the link between the two notes back to what it was (none,
    or its weight and reasons; none when the newer note is gone). Audited (``unsupersede``).
    False when ``old_id`` is not superseded or changed since."""
    entry = _last_supersede(ctx, ns, old_id)
    if entry is None:
        return False
    before, after = entry
    new_id = str(after["superseded_by"])
    keys = ctx.keys
    with (
        Lease(ctx.redis, keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer) as lease,
        lease.kept(),
    ):
        texts = pairs.read_texts(ctx, ns, [old_id, new_id])
        old, new = texts.get(old_id), texts.get(new_id)
        if old is None or old.superseded_by != new_id:
            return False
        linked = _current_links(ctx, ns, [Decision(old_id, new_id, "", "")])[old_id]
        restore = before["link"] if new is not None and new.active else None
        with lease.fenced() as pipe:
            pipe.hdel(keys.note(ns, old_id), "valid_to", "superseded_by")
            notes.changed(pipe, keys, ns)
            pipe.hset(keys.note(ns, old_id), "updated_at", time.time())
            if restore is not None:
                _link(pipe, ctx, ns, old_id, new_id, restore)
            elif linked is not None:
                pipe.hdel(keys.links(ns, old_id), new_id)
                pipe.hdel(keys.links(ns, new_id), old_id)
            pipe.hincrby(keys.stats(ns), "links", (restore is not None) - (linked is not None))
            pipe.hincrby(keys.stats(ns), "superseded", -1)
            notes.audit(
                pipe,
                keys,
                ns,
                "unsupersede",
                old_id,
                actor="worker",
                source="supersession:revert",
                before={**after, "link": linked},
                after={**before, "link": restore},
            )
            pipe.execute()
    return True


def _last_supersede(
    ctx: WorkerContext, ns: str, old_id: str
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(before, after) of the newest ``supersede`` audit entry of ``old_id``."""
    high = "+"
    while True:
        rows = ctx.redis.xrevrange(ctx.keys.audit(ns), max=high, count=AUDIT_CHUNK)
        for _, e in rows:
            if e[b"op"] == b"supersede" and e[b"id"].decode() == old_id:
                return msgpack.unpackb(e[b"before"]), msgpack.unpackb(e[b"after"])
        if len(rows) < AUDIT_CHUNK:
            return None
        high = f"({rows[-1][0].decode()}"


def _link(
    pipe: Pipeline, ctx: WorkerContext, ns: str, old_id: str, new_id: str, state: list[Any]
) -> None:
    """Both sides of the old-new link: [weight, old side meta, new side meta]."""
    keys = ctx.keys
    weight, old_meta, new_meta = state
    pipe.hset(keys.links(ns, old_id), new_id, pack_link(weight, old_meta))
    pipe.hset(keys.links(ns, new_id), old_id, pack_link(weight, new_meta))
