"""Supersession through real Redis, real ingest and a real search server: the self-organising
Zettelkasten tutorial's switch from React to Svelte closes the React note's validity at ingest,
search ranks the valid note first and marks the other, as_of sees the past; hedged changes
supersede nothing; the LLM judge (loopback server) supersedes what the rule cannot see and fails
closed on bad answers."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest

from producer import MemoryClient
from producer.protocol import unpack_link
from tests.conftest import drain_all, make_settings
from tests.integration.chat_server import ChatServer, Scripted, answer, chat
from worker.context import WorkerContext
from worker.organise import pairs
from worker.organise.supersession import NEAREST_K, revert_supersession, supersede_namespace
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace

__all__ = ["chat"]

DAY = 86_400.0
T0 = 1_767_225_600.0  #: 2026-01-01 UTC
REACT = "We chose React for the frontend because the team knows it well."
SVELTE = "We are switching the frontend to Svelte for better performance."
STORY = [
    "The project 'Apollo' aims to build a dashboard for tracking solar panel efficiency.",
    REACT,
    "The backend must be Python to support the data science libraries.",
    "Client called. They are unhappy with React performance on low-end devices.",
    SVELTE,
]


@pytest.fixture
def served(ctx: WorkerContext) -> Iterator[MemoryClient]:
    srv = SearchServer(ctx).start()
    try:
        with MemoryClient(ctx.settings) as mem:
            yield mem
    finally:
        srv.stop()


def store_story(ctx: WorkerContext, mem: MemoryClient, ns: str) -> list[str]:
    items = [{"content": text, "event_time": T0 + i * DAY} for i, text in enumerate(STORY)]
    ids = mem.store_many(items, namespace=ns)
    drain_all(ctx)
    return ids


def meta(ctx: WorkerContext, ns: str, a: str, b: str) -> dict:
    return unpack_link(ctx.redis.hget(ctx.keys.links(ns, a), b))[1]


def audit(ctx: WorkerContext, ns: str, op: bytes) -> list[dict]:
    entries = [e for _, e in ctx.redis.xrange(ctx.keys.audit(ns)) if e[b"op"] == op]
    return [
        {
            "id": e[b"id"].decode(),
            "source": e[b"source"].decode(),
            "before": msgpack.unpackb(e[b"before"]),
            "after": msgpack.unpackb(e[b"after"]),
        }
        for e in entries
    ]


def test_the_switch_to_svelte_supersedes_the_react_choice_at_ingest(ctx, served):
    ids = store_story(ctx, served, "s")
    react, svelte = ids[1], ids[4]

    old = served.get(react, namespace="s")
    assert old.valid_to == T0 + 4 * DAY and old.superseded_by == svelte
    assert old.links[svelte] == served.get(svelte, namespace="s").links[react]
    assert meta(ctx, "s", react, svelte)["reason"] == "superseded_by"
    assert meta(ctx, "s", svelte, react)["reason"] == "supersedes"
    assert meta(ctx, "s", svelte, react)["source"] == "rule"
    assert "frontend: react -> svelte" == meta(ctx, "s", react, svelte)["why"]
    for other in (ids[0], ids[2], ids[3], svelte):
        assert served.get(other, namespace="s").valid_to is None
    (entry,) = audit(ctx, "s", b"supersede")
    assert entry["id"] == react and entry["source"] == "supersession:rule"
    assert entry["before"]["valid_to"] is None and entry["after"]["superseded_by"] == svelte
    assert check_namespace(ctx, "s") == []


def test_search_ranks_valid_notes_first_and_as_of_sees_the_past(ctx, served):
    ids = store_story(ctx, served, "s")
    react, svelte = ids[1], ids[4]
    query = "what is the current frontend technology and why?"

    hits = served.search(query, namespace="s", k=5)
    order = [h.id for h in hits]
    assert order[0] == svelte and react in order
    assert all(h.valid_to is None for h in hits[: order.index(react)])
    marked = hits[order.index(react)]
    assert marked.superseded_by == svelte and marked.valid_to == T0 + 4 * DAY

    before = served.search(query, namespace="s", k=5, as_of=T0 + 3.5 * DAY)
    assert before[0].id == react
    assert svelte not in {h.id for h in before}
    assert served.search(query, namespace="s", k=5, as_of=T0 + 4 * DAY)[0].id == svelte
    text = served.context(query, namespace="s")
    assert f'superseded_by="{svelte}"' in text


@pytest.mark.parametrize(
    "change",
    [
        "Should we switch the frontend to Svelte?",
        "We might switch the frontend to Svelte next quarter.",
        "We are not switching the frontend to Svelte.",
        "We plan to move the frontend to Svelte.",
        "The frontend team switched to Slack for chat.",
        "We are switching the frontend to something faster.",
        "Svelte and React both work for the frontend.",
    ],
)
def test_hedged_or_unrelated_changes_supersede_nothing(ctx, served, change):
    served.store(REACT, namespace="n", event_time=T0)
    served.store(change, namespace="n", event_time=T0 + DAY)
    drain_all(ctx)
    assert supersede_namespace(ctx, "n") == 0
    assert ctx.redis.xlen(ctx.keys.audit("n")) == 2
    hits = served.search("frontend", namespace="n", k=5)
    assert len(hits) == 2 and all(h.valid_to is None and h.superseded_by is None for h in hits)


def test_an_older_change_never_supersedes_a_newer_note(ctx, served):
    served.store(SVELTE, namespace="o", event_time=T0)
    served.store(REACT, namespace="o", event_time=T0 + DAY)
    drain_all(ctx)
    assert supersede_namespace(ctx, "o") == 0
    assert all(h.valid_to is None for h in served.search("frontend", namespace="o", k=5))


DEPLOYS = ["Deploys run every Friday afternoon.", "Deploys now happen on Monday mornings."]


def llm_ctx(tmp_path, chat: ChatServer, **overrides) -> WorkerContext:
    return WorkerContext.build(make_settings(tmp_path, llm_url=chat.url, **overrides))


def test_the_llm_judge_supersedes_what_the_rule_cannot_see(redis_db, tmp_path, chat):
    ctx = llm_ctx(tmp_path, chat)
    try:
        with MemoryClient(ctx.settings) as mem:
            old, new = (mem.store(t, namespace="d") for t in DEPLOYS)
            drain_all(ctx)
            assert mem.get(old, namespace="d").valid_to is None  # the rule saw no change
            chat.reply_with(answer({"supersessions": [{"new": 1, "old": 2, "why": "new day"}]}))

            assert supersede_namespace(ctx, "d") == 1

            note = mem.get(old, namespace="d")
            assert note.superseded_by == new
            assert note.valid_to == mem.get(new, namespace="d").created_at
        prompt = chat.requests[-1]["messages"][1]["content"]
        assert f") {DEPLOYS[1]}" in prompt.split("NEW [1] (")[1].splitlines()[0]
        assert f") {DEPLOYS[0]}" in prompt.split("OLDER [2] (")[1].splitlines()[0]
        assert meta(ctx, "d", old, new)["source"] == f"model:{ctx.settings.llm_model}"
        assert supersede_namespace(ctx, "d") == 0  # the cursor moved on: no second call
        assert len(chat.requests) == 1
        assert check_namespace(ctx, "d") == []
    finally:
        ctx.close()


@pytest.mark.parametrize(
    "reply",
    [
        answer({"supersessions": [{"new": 1, "old": 7, "why": "x"}]}),  # never shown
        answer({"supersessions": [{"new": 2, "old": 1, "why": "x"}]}),  # not new -> older
        Scripted("this is not json"),
        Scripted(status=500),
    ],
)
def test_a_bad_llm_answer_supersedes_nothing(redis_db, tmp_path, chat, reply):
    ctx = llm_ctx(tmp_path, chat, llm_timeout_s=2.0)
    try:
        with MemoryClient(ctx.settings) as mem:
            ids = [mem.store(t, namespace="d") for t in DEPLOYS]
            drain_all(ctx)
            chat.reply_with(reply)
            assert supersede_namespace(ctx, "d") == 0
            assert all(mem.get(i, namespace="d").valid_to is None for i in ids)
        assert int(ctx.redis.hget(ctx.keys.stats("d"), "llm_failures")) == 1
        assert not audit(ctx, "d", b"supersede")
    finally:
        ctx.close()


def test_the_llm_judges_several_new_notes_per_call(redis_db, tmp_path, chat):
    ctx = llm_ctx(tmp_path, chat, supersede_llm_batch=4)
    topics = ["billing", "search", "deploy", "backup", "alerting", "logging"]
    try:
        with MemoryClient(ctx.settings) as mem:
            for topic in topics:
                mem.store(f"The {topic} service runs in the Frankfurt region.", namespace="b")
            drain_all(ctx)
            chat.reply_with(answer({"supersessions": []}))
            assert supersede_namespace(ctx, "b") == 0
        assert len(chat.requests) == 2  # 5 new notes with an older neighbour, 4 per call
    finally:
        ctx.close()


def snapshot(ctx: WorkerContext, ns: str, ids: list[str]) -> dict:
    out = {}
    for nid in ids:
        note = ctx.redis.hgetall(ctx.keys.note(ns, nid))
        note.pop(b"updated_at", None)
        out[nid] = (note, ctx.redis.hgetall(ctx.keys.links(ns, nid)))
    out["links"] = ctx.redis.hget(ctx.keys.stats(ns), "links")
    return out


def test_a_revert_restores_the_exact_previous_state(redis_db, tmp_path):
    settings = make_settings(tmp_path, supersede=False)
    plain, judging = WorkerContext.build(settings), None
    try:
        with MemoryClient(settings) as mem:
            ids = store_story(plain, mem, "r")
        react, svelte = ids[1], ids[4]
        before = snapshot(plain, "r", [react, svelte])
        assert supersede_namespace(plain, "r") == 0  # off
        judging = WorkerContext.build(settings.model_copy(update={"supersede": True}))
        assert supersede_namespace(judging, "r") == 1
        assert snapshot(judging, "r", [react, svelte]) != before

        assert revert_supersession(judging, "r", react)

        assert snapshot(judging, "r", [react, svelte]) == before
        assert not revert_supersession(judging, "r", react)  # nothing left to revert
        (entry,) = audit(judging, "r", b"unsupersede")
        assert entry["before"]["superseded_by"] == svelte and entry["after"]["valid_to"] is None
        assert check_namespace(judging, "r") == []
    finally:
        plain.close()
        if judging is not None:
            judging.close()


def test_an_older_statement_far_in_embedding_space_is_found_by_its_subject(ctx, served):
    react = served.store(REACT, namespace="busy", event_time=T0)
    decoys = [
        f"We are switching shift {i} of the support rota for better performance reviews."
        for i in range(15)
    ]
    served.store_many([{"content": d, "event_time": T0 + DAY} for d in decoys], namespace="busy")
    drain_all(ctx)
    svelte = served.store(SVELTE, namespace="busy", event_time=T0 + 2 * DAY)
    drain_all(ctx)

    near = pairs.nearest(ctx, "busy", [svelte], NEAREST_K, ctx.settings.supersede_min_cosine)
    assert react not in {nb for nb, _ in near[svelte]}  # not among the dense candidates
    assert served.get(react, namespace="busy").superseded_by == svelte
    decoy_hits = served.search("support rota shift", namespace="busy", k=20)
    assert all(h.valid_to is None for h in decoy_hits)
