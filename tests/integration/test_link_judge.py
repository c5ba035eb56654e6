"""The LLM link judge through real Redis, the real ingest drain and the loopback chat server:
batched calls (at most 0.25 per organised note), labelled links from the model's answers, and
every failure (malformed JSON, unknown ids, answers off the schema, slow answers, a spent
budget) failing closed to the heuristic judge's links."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from producer import MemoryClient
from producer.protocol import unpack_link
from tests.conftest import drain_all, make_settings
from tests.integration.chat_server import ChatServer, Scripted, answer, chat
from worker.context import WorkerContext
from worker.organise.judge import judge_namespace
from worker.organise.periodic import run_periodic
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace

__all__ = ["chat"]

NS = "judge"
MODEL = "model:gpt-4o-mini"
INVOICES = [
    "The billing service stores every invoice in Postgres.",
    "Each invoice in Postgres is archived nightly by the billing service.",
    "The billing service emails an invoice to the customer once it is archived.",
    "An invoice older than seven years is purged from the billing archive.",
]
DECOYS = [
    "The billing service team meets on Mondays in Postgres room four.",
    "Postgres room four has a broken projector, says the billing service team.",
]
CANDIDATE = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


def build(tmp_path, chat_url: str, **overrides: object) -> WorkerContext:
    values: dict[str, object] = {
        "judge": "llm",
        "llm_url": chat_url,
        "llm_timeout_s": 2.0,
        "sequence_weight": 0.0,  # only similarity links, so every link is the judge's business
        "judge_max_wait_s": 0.0,  # judge a partial group at once
    }
    values.update(overrides)
    return WorkerContext.build(make_settings(tmp_path, **values))


@pytest.fixture
def jctx(redis_db, tmp_path, chat: ChatServer) -> Iterator[WorkerContext]:
    ctx = build(tmp_path, chat.url)
    yield ctx
    ctx.close()


def link_invoices(request: dict[str, Any]) -> Scripted:
    """The loopback model: when a new note and its candidate both talk about an invoice, link
    them as "supports"."""
    prompt = request["messages"][1]["content"]
    picks = [
        {"candidate": int(n), "relation": "supports"}
        for section in prompt.split("\nNew note ")[1:]
        if "invoice" in section.splitlines()[0].lower()
        for n, text in CANDIDATE.findall(section)
        if "invoice" in text.lower()
    ]
    return Scripted(json.dumps({"links": picks}), prompt_tokens=300, completion_tokens=20)


def queued(ctx: WorkerContext, ns: str = NS) -> list[dict[str, Any]]:
    return [msgpack.unpackb(raw) for raw in ctx.redis.lrange(ctx.keys.judge(ns), 0, -1)]


def links(ctx: WorkerContext, ns: str = NS) -> dict[tuple[str, str], tuple[float, dict[str, Any]]]:
    """Every directed link with its weight and meta."""
    out = {}
    for nid in (m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)):
        for nb, raw in ctx.redis.hgetall(ctx.keys.links(ns, nid)).items():
            w, meta = unpack_link(raw)
            meta.pop("at")
            out[(nid, nb.decode())] = (w, meta)
    return out


def counters(ctx: WorkerContext, ns: str = NS) -> dict[str, int]:
    raw = ctx.redis.hgetall(ctx.keys.stats(ns))
    return {
        k.decode(): int(v) for k, v in raw.items() if k.startswith((b"llm_", b"judge_", b"links"))
    }


def seed(ctx: WorkerContext, mem: MemoryClient, texts: list[str]) -> dict[str, str]:
    ids = dict(zip(mem.store_many(texts, namespace=NS), texts, strict=True))
    assert drain_all(ctx) == len(texts)
    return ids


def test_the_model_decides_the_links_and_their_labels(jctx, chat):
    chat.responder = link_invoices
    with MemoryClient(jctx.settings) as mem:
        text = seed(jctx, mem, INVOICES + DECOYS)
        requests = queued(jctx)
        heuristic = links(jctx)
        assert requests and heuristic, "the heuristic links at once; the judge comes later"

        assert judge_namespace(jctx, NS) == len(requests)

        after = links(jctx)
        assert queued(jctx) == []
        for req in requests:
            for cid, _ in req["c"]:
                pair = (req["id"], cid)
                if "invoice" in text[req["id"]].lower() and "invoice" in text[cid].lower():
                    weight, meta = after[pair]
                    assert meta["label"] == "supports" and meta["source"] == MODEL
                    assert meta["reason"].startswith("judged supports; cosine")
                    assert weight >= jctx.settings.link_threshold
                    assert after[(cid, req["id"])] == after[pair]  # both sides
                    assert mem.get(req["id"], namespace=NS).link_labels[cid] == "supports"
                else:
                    assert pair not in after, "a candidate the model left out is unlinked"
        rejected = [p for p in heuristic if p not in after]
        assert rejected, "the decoys' rule links to invoices were taken back"
        assert check_namespace(jctx, NS) == []
        assert mem.stats(NS).links == len(after) // 2
        stats = counters(jctx)
        assert stats["judge_notes"] == len(requests) and stats["judge_calls"] == len(chat.requests)
        assert stats["llm_calls"] == len(chat.requests)
        assert stats["llm_prompt_tokens"] == 300 * len(chat.requests)
        assert stats["llm_completion_tokens"] == 20 * len(chat.requests)
        reported = mem.stats(NS).counters  # the same counters through the client
        assert {k: reported[k] for k in ("judge_notes", "judge_calls", "llm_calls")} == {
            k: stats[k] for k in ("judge_notes", "judge_calls", "llm_calls")
        }
        audits = [e for _, e in jctx.redis.xrange(jctx.keys.audit(NS)) if e[b"op"] == b"link"]
        assert audits and all(e[b"source"] == f"judge:{MODEL}".encode() for e in audits)


def test_labels_reach_connected_and_search_hits(jctx, chat):
    chat.responder = link_invoices
    with MemoryClient(jctx.settings) as mem:
        text = seed(jctx, mem, INVOICES)
        judge_namespace(jctx, NS)
        first = next(nid for nid, t in text.items() if t == INVOICES[0])
        near = mem.connected(first, namespace=NS, max_hops=1)
        assert near and {n.label for n in near} == {"supports"}
        srv = SearchServer(jctx).start()
        try:
            hits = mem.search("invoice Postgres billing", namespace=NS, k=4)
        finally:
            srv.stop()
        hit = next(h for h in hits if h.links)
        assert set(hit.link_labels) == set(hit.links)
        assert set(hit.link_labels.values()) == {"supports"}


def test_one_call_judges_several_notes(jctx, chat):
    chat.responder = link_invoices
    texts = [f"Invoice batch {i} of the billing service is stored in Postgres." for i in range(16)]
    with MemoryClient(jctx.settings) as mem:
        seed(jctx, mem, texts)
        judged = run_periodic(jctx, "judge")

    assert judged >= 12
    assert len(chat.requests) <= 0.25 * len(texts)
    prompt = chat.requests[0]["messages"][1]["content"]
    assert "New note A:" in prompt and "New note B:" in prompt


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Scripted("this is not json"), "malformed"),
        (answer({"links": [{"candidate": 999, "relation": "supports"}]}), "unknown_id"),
        (answer({"links": [{"candidate": 1, "relation": "loves"}]}), "schema"),
    ],
)
def test_a_bad_answer_keeps_the_heuristic_links(jctx, chat, reply, reason):
    chat.reply_with(reply)
    with MemoryClient(jctx.settings) as mem:
        text = seed(jctx, mem, INVOICES + DECOYS)
        before, requests = links(jctx), queued(jctx)

        assert judge_namespace(jctx, NS) == len(requests)

        assert links(jctx) == before
        assert queued(jctx) == []
        assert all(mem.get(nid, namespace=NS).content == t for nid, t in text.items())
    stats = counters(jctx)
    assert stats[f"llm_fail_{reason}"] == stats["judge_calls"] >= 1
    assert stats["judge_fallbacks"] == len(requests)


def test_a_slow_answer_times_out_and_keeps_the_heuristic_links(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, llm_timeout_s=0.3)
    chat.reply_with(answer({"links": []}, delay_s=5.0))
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem, INVOICES)
            before = links(ctx)
            judge_namespace(ctx, NS)
            assert links(ctx) == before and queued(ctx) == []
        assert counters(ctx)["llm_fail_timeout"] >= 1
    finally:
        ctx.close()


def test_a_spent_budget_keeps_the_heuristic_links_and_calls_nobody(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, llm_budget_per_hour=0)
    chat.responder = link_invoices
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem, INVOICES)
            before, requests = links(ctx), queued(ctx)
            judge_namespace(ctx, NS)
            assert links(ctx) == before and queued(ctx) == []
        assert chat.requests == []
        stats = counters(ctx)
        assert stats["llm_fail_budget"] == stats["judge_calls"] >= 1
        assert stats["judge_fallbacks"] == len(requests)
    finally:
        ctx.close()


def test_a_candidate_deleted_before_the_verdict_is_never_linked(jctx, chat):
    chat.responder = link_invoices
    with MemoryClient(jctx.settings) as mem:
        text = seed(jctx, mem, INVOICES[:3])
        victim = next(nid for nid, t in text.items() if t == INVOICES[0])
        mem.delete(victim, namespace=NS)
        drain_all(jctx)

        judge_namespace(jctx, NS)

        assert all(victim not in pair for pair in links(jctx))
        assert check_namespace(jctx, NS) == []


def test_a_note_changed_before_the_verdict_is_judged_on_its_new_candidates_only(jctx, chat):
    chat.responder = link_invoices
    with MemoryClient(jctx.settings) as mem:
        text = seed(jctx, mem, INVOICES[:3])
        last = next(nid for nid, t in text.items() if t == INVOICES[2])
        mem.store(INVOICES[3], namespace=NS, id=last)
        drain_all(jctx)
        assert [r["id"] for r in queued(jctx)].count(last) == 2

        entries = len(queued(jctx))

        assert judge_namespace(jctx, NS) == entries - 1  # the stale entry is dropped unjudged
        assert queued(jctx) == []
        assert counters(jctx)["judge_notes"] == entries - 1
        assert check_namespace(jctx, NS) == []


def test_with_the_heuristic_judge_nothing_is_queued_or_called(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, judge="heuristic")
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem, INVOICES)
        assert queued(ctx) == [] and run_periodic(ctx, "judge") == 0 and chat.requests == []
    finally:
        ctx.close()


def test_fewer_notes_than_a_call_takes_wait_for_company(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, judge_max_wait_s=3600.0, judge_notes_per_call=4)
    chat.responder = link_invoices
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem, INVOICES)  # 3 notes have candidates: one short of a call
            assert judge_namespace(ctx, NS) == 0 and len(queued(ctx)) == 3
            seed(ctx, mem, DECOYS)  # 5 now: one call's worth is judged, one note waits on
            assert judge_namespace(ctx, NS) == 4 and len(queued(ctx)) == 1
        assert len(chat.requests) == 1
    finally:
        ctx.close()


def link_everything(request: dict[str, Any]) -> Scripted:
    prompt = request["messages"][1]["content"]
    picks = [{"candidate": int(n), "relation": "related"} for n, _ in CANDIDATE.findall(prompt)]
    return Scripted(json.dumps({"links": picks}))


def test_the_degree_cap_holds_for_the_models_links_too(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, max_degree=2)
    chat.responder = link_everything
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem, INVOICES + DECOYS)
            judge_namespace(ctx, NS)
            after = links(ctx)
            assert any(meta["source"] == MODEL for _, meta in after.values())
            degree = Counter(a for a, _ in after)
            assert max(degree.values()) == 2
            assert mem.stats(NS).links == len(after) // 2
        assert check_namespace(ctx, NS) == []
    finally:
        ctx.close()
