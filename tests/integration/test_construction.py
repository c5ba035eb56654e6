"""Note construction through real Redis, the real ingest and the loopback chat server:
deterministic keywords/tags/context by default; with ZQ_CONSTRUCTION=llm one call per
construct_batch notes, a good answer applied and every bad one falling back to the
deterministic fields; atomisation into child notes that a redelivered job never duplicates."""

from __future__ import annotations

import re
from collections.abc import Iterator

import msgpack
import pytest

from producer import MemoryClient
from producer.protocol import unpack_link
from tests.conftest import drain_all, make_settings
from tests.integration.chat_server import ChatServer, Scripted, answer, answer_with, chat
from worker.context import WorkerContext
from worker.intake import construction
from worker.intake.drain import decode_job
from worker.intake.ingest import handle_jobs
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace
from worker.text import MAX_KEYWORD_CHARS, extract_keywords, lead_sentence

__all__ = ["chat"]

ITEM = re.compile(r"^\[(\d+)\]( SPLIT)?$", re.MULTILINE)
SENTENCE = re.compile(r"(?<=\.)\s+")
LONG = (
    "The Apollo dashboard tracks solar panel efficiency for the client. "
    "We chose React for the frontend because the team knows it well. "
    "The backend must be Python to support the data science libraries."
)
NOTES = [
    "Snowflake uses key-pair auth with Azure AD. Rotation happens every ninety days.",
    "The invoice service retries failed payments three times before alerting finance.",
]


def items(prompt: str) -> list[tuple[int, bool, str]]:
    """(number, marked SPLIT, content) of each note in a construction prompt."""
    marks = list(ITEM.finditer(prompt))
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(prompt)
        out.append((int(m.group(1)), bool(m.group(2)), prompt[m.end() : end].strip()))
    return out


def describe(prompt: str) -> dict[str, object]:
    """A well-formed answer: model words per note, and the sentences of a SPLIT note as atoms."""
    notes = []
    for n, split, content in items(prompt):
        atoms = [
            {"content": s, "keywords": [f"fact{n}x{k}"], "tags": ["atom"], "context": f"fact {k}"}
            for k, s in enumerate(SENTENCE.split(content), start=1)
        ]
        notes.append(
            {
                "note": n,
                "keywords": [f"Model{n} word", "the"],
                "tags": ["Topic"],
                "context": f"Model context of note {n}.",
                "atoms": atoms if split else [],
            }
        )
    return {"notes": notes}


def build(tmp_path, chat_url: str | None, **overrides: object) -> WorkerContext:
    values: dict[str, object] = {
        "llm_url": chat_url,
        "llm_timeout_s": 5.0,
        "construction": "llm",
        "atomise": True,
        "atomise_min_chars": 120,
    }
    values.update(overrides)
    return WorkerContext.build(make_settings(tmp_path, **values))


@pytest.fixture
def cctx(redis_db, tmp_path, chat: ChatServer) -> Iterator[WorkerContext]:
    ctx = build(tmp_path, chat.url)
    yield ctx
    ctx.close()


def counters(ctx: WorkerContext, ns: str) -> dict[str, int]:
    raw = ctx.redis.hgetall(ctx.keys.stats(ns))
    names = (b"llm_", b"construct_")
    return {k.decode(): int(v) for k, v in raw.items() if k.startswith(names)}


def active(ctx: WorkerContext, ns: str) -> set[str]:
    return {m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)}


def consistent(ctx: WorkerContext, ns: str) -> bool:
    """The namespace passes the integrity check and its link counter matches its links."""
    ids = active(ctx, ns)
    degree = sum(ctx.redis.hlen(ctx.keys.links(ns, nid)) for nid in ids)
    links = int(ctx.redis.hget(ctx.keys.stats(ns), "links") or 0)
    return check_namespace(ctx, ns) == [] and links * 2 == degree


def audit(ctx: WorkerContext, ns: str) -> list[tuple[str, str]]:
    return [(e[b"op"].decode(), e[b"id"].decode()) for _, e in ctx.redis.xrange(ctx.keys.audit(ns))]


def test_the_deterministic_context_is_the_lead_sentence_and_stable(ctx, client):
    nid = client.store(NOTES[0], namespace="d", tags=["auth"], id="n1")
    long_id = client.store("word " * 100, namespace="d")
    drain_all(ctx)

    note = client.get(nid, namespace="d")
    assert note.context == "Snowflake uses key-pair auth with Azure AD."
    assert note.keywords == extract_keywords(NOTES[0])
    assert note.tags[0] == "auth" and note.tags[1:] == note.keywords[:4]
    long_context = client.get(long_id, namespace="d").context
    assert len(long_context) <= construction.CONTEXT_MAX_CHARS and long_context.endswith("\u2026")

    client.store(NOTES[0], namespace="d", tags=["login"], id="n1")
    drain_all(ctx)

    again = client.get(nid, namespace="d")
    assert (again.context, again.keywords, again.version) == (note.context, note.keywords, 2)
    assert again.tags == ["login", *note.keywords[:4]]
    (_, last), *_ = reversed(ctx.redis.xrange(ctx.keys.audit("d")))
    assert msgpack.unpackb(last[b"after"])["context"] == note.context


@pytest.mark.parametrize("max_tag_chars", [64, 8])
def test_a_very_long_word_never_becomes_a_keyword_or_a_tag(redis_db, tmp_path, max_tag_chars):
    ctx = WorkerContext.build(make_settings(tmp_path, max_tag_chars=max_tag_chars))
    try:
        with MemoryClient(ctx.settings) as mem:
            blob = "x" * 20_000
            nid = mem.store(f"The upload token {blob} expired; tokens expire daily.", namespace="w")
            drain_all(ctx)
            note = mem.get(nid, namespace="w")
    finally:
        ctx.close()
    assert blob not in note.keywords and "token" in note.keywords
    assert note.tags and all(len(tag) <= max_tag_chars for tag in note.tags)
    assert all(len(kw) <= MAX_KEYWORD_CHARS for kw in note.keywords)


def test_a_good_answer_sets_keywords_tags_and_context_and_keeps_caller_tags(cctx, chat):
    chat.reply_with(answer_with(describe))
    with MemoryClient(cctx.settings) as mem:
        ids = mem.store_many([{"content": NOTES[0], "tags": ["Mine"]}, NOTES[1]], namespace="g")
        drain_all(cctx)

        first, second = (mem.get(nid, namespace="g") for nid in ids)

    assert first.keywords == ["topic", "model1", "word"]
    assert first.tags == ["Mine", "topic", "model1", "word"]
    assert first.context == "Model context of note 1."
    assert second.context == "Model context of note 2." and second.kind == "note"
    assert len(chat.requests) == 1
    assert counters(cctx, "g") == {
        "llm_calls": 1,
        "llm_tokens": 42,
        "construct_calls": 1,
        "construct_tokens": 42,
        "construct_notes": 2,
        "construct_fallbacks": 0,
        "construct_atoms": 0,
    }


def test_one_call_describes_construct_batch_notes(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, construct_batch=3, atomise=False)
    chat.reply_with(answer_with(describe))
    try:
        with MemoryClient(ctx.settings) as mem:
            texts = [f"Note number {i} about topic {i}." for i in range(7)]
            ids = mem.store_many(texts, namespace="b")
            drain_all(ctx)
            contexts = [mem.get(nid, namespace="b").context for nid in ids]

        sizes = [len(items(r["messages"][1]["content"])) for r in chat.requests]
        assert sorted(sizes) == [1, 3, 3]
        assert sorted(contexts) == sorted(
            f"Model context of note {n}." for n in (1, 2, 3) * 2 + (1,)
        )
        assert counters(ctx, "b")["construct_calls"] == 3
        assert counters(ctx, "b")["construct_notes"] == 7
    finally:
        ctx.close()


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Scripted("these are not the notes you want"), "malformed"),
        (
            answer({"notes": [{"note": 9, "keywords": [], "tags": [], "context": "x"}]}),
            "unknown_id",
        ),
        (
            answer({"notes": [{"note": 1, "keywords": ["a"] * 20, "tags": [], "context": "x"}]}),
            "schema",
        ),
        (answer_with(lambda p: {"notes": describe(p)["notes"] * 2}), "schema"),
        (Scripted(status=503), "http"),
    ],
)
def test_a_bad_answer_leaves_the_deterministic_fields(cctx, chat, reply, reason):
    chat.reply_with(reply)
    with MemoryClient(cctx.settings) as mem:
        ids = mem.store_many([{"content": NOTES[0], "tags": ["mine"]}, LONG], namespace="f")
        drain_all(cctx)

        first, second = (mem.get(nid, namespace="f") for nid in ids)

    assert first.keywords == extract_keywords(NOTES[0])
    assert first.tags == ["mine", *first.keywords[:4]]
    assert first.context == lead_sentence(NOTES[0])
    assert second.context == lead_sentence(LONG) and second.kind == "note"
    assert active(cctx, "f") == set(ids)  # the long input was stored as one note
    got = counters(cctx, "f")
    assert got["construct_fallbacks"] == 2 and got["construct_notes"] == 0
    assert got[f"llm_fail_{reason}"] == 1 and got["construct_calls"] == 1


def test_a_note_the_answer_leaves_out_keeps_its_deterministic_fields(cctx, chat):
    chat.reply_with(answer_with(lambda p: {"notes": describe(p)["notes"][:1]}))
    with MemoryClient(cctx.settings) as mem:
        ids = mem.store_many(NOTES, namespace="p")
        drain_all(cctx)
        first, second = (mem.get(nid, namespace="p") for nid in ids)

    assert first.context == "Model context of note 1."
    assert second.context == lead_sentence(NOTES[1])
    assert counters(cctx, "p")["construct_fallbacks"] == 1


def test_a_slow_answer_times_out_and_falls_back(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, llm_timeout_s=0.5)
    chat.reply_with(answer_with(describe, delay_s=5.0))
    try:
        with MemoryClient(ctx.settings) as mem:
            nid = mem.store(NOTES[0], namespace="s")
            drain_all(ctx)
            assert mem.get(nid, namespace="s").context == lead_sentence(NOTES[0])
        assert counters(ctx, "s")["llm_fail_timeout"] == 1
    finally:
        ctx.close()


def test_an_answer_slower_than_the_lease_is_applied(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url)  # the namespace lock is renewed while the call runs
    assert ctx.settings.lease_s < 3.0 < ctx.settings.llm_timeout_s
    chat.reply_with(answer_with(describe, delay_s=3.0))
    try:
        with MemoryClient(ctx.settings) as mem:
            nid = mem.store(NOTES[0], namespace="l")
            drain_all(ctx)
            assert mem.get(nid, namespace="l").context == "Model context of note 1."
    finally:
        ctx.close()


def test_with_the_budget_spent_nothing_is_called(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, llm_budget_per_hour=0)
    try:
        with MemoryClient(ctx.settings) as mem:
            nid = mem.store(LONG, namespace="x")
            drain_all(ctx)
            note = mem.get(nid, namespace="x")
        assert (note.context, note.kind) == (lead_sentence(LONG), "note")
        assert chat.requests == []
        assert counters(ctx, "x")["llm_fail_budget"] == 1
        assert active(ctx, "x") == {nid}
    finally:
        ctx.close()


def test_a_long_input_is_split_into_searchable_atoms_linked_to_it(cctx, chat):
    chat.reply_with(answer_with(describe))
    srv = SearchServer(cctx).start()
    try:
        with MemoryClient(cctx.settings) as mem:
            nid = mem.store(LONG, namespace="a", agent="pm", tags=["apollo"], metadata={"m": 1})
            short = mem.store(NOTES[1], namespace="a")
            drain_all(cctx)

            source = mem.get(nid, namespace="a")
            atoms = [mem.get(construction.atom_id(nid, k), namespace="a") for k in (1, 2, 3)]
            hits = mem.search("React frontend team", namespace="a", k=3)
            facts = mem.search("React frontend team", namespace="a", filters={"kind": "note"})
    finally:
        srv.stop()

    assert source.kind == "source" and source.content == LONG
    assert [a.content for a in atoms] == SENTENCE.split(LONG)
    for k, atom in enumerate(atoms, start=1):
        assert atom.metadata == {"m": 1, "part_of": nid}
        assert atom.agent == "pm" and atom.tags[0] == "apollo" and atom.kind == "note"
        assert atom.context == f"fact {k}" and atom.keywords[:2] == ["atom", f"fact1x{k}"]
        assert atom.links[nid] == 1.0
        meta = unpack_link(cctx.redis.hget(cctx.keys.links("a", atom.id), nid))[1]
        assert "part_of" in meta["reason"]
    assert set(source.links) >= {a.id for a in atoms}
    assert atoms[1].id in [h.id for h in hits]
    assert nid in [h.id for h in hits if h.kind == "source"]
    assert atoms[1].id in [h.id for h in facts] and nid not in [h.id for h in facts]
    assert active(cctx, "a") == {nid, short, *(a.id for a in atoms)}
    assert sorted(audit(cctx, "a")) == sorted(
        [("create", nid), ("create", short)] + [("create", a.id) for a in atoms]
    )
    assert len(chat.requests) == 1  # the atoms were described in the same call
    assert counters(cctx, "a")["construct_atoms"] == 3
    assert msgpack.unpackb(cctx.redis.get(cctx.keys.tail("a")))[0] == short
    assert consistent(cctx, "a")


def test_a_redelivered_job_creates_the_atoms_once(cctx, chat):
    chat.reply_with(answer_with(describe))
    with MemoryClient(cctx.settings) as mem:
        nid = mem.store(LONG, namespace="r")
        inbox = cctx.keys.inbox(cctx.keys.shard_of("r"))
        entries = [(eid.decode(), decode_job(cctx, f)) for eid, f in cctx.redis.xrange(inbox)]
        drain_all(cctx)
        before = (active(cctx, "r"), audit(cctx, "r"), mem.stats("r").links)

        handle_jobs(cctx, "r", entries)  # the same entries again, as after a crash before XACK

        assert (active(cctx, "r"), audit(cctx, "r"), mem.stats("r").links) == before
        assert len(before[0]) == 4 and len(chat.requests) == 1
        assert consistent(cctx, "r")

        mem.store(LONG, namespace="r", id=nid)  # a retried store: same id, same content
        drain_all(cctx)

        assert active(cctx, "r") == before[0] and len(chat.requests) == 1
        assert mem.get(nid, namespace="r").kind == "source"


def test_a_changed_input_is_split_again_and_its_surplus_atoms_retired(cctx, chat):
    chat.reply_with(answer_with(describe))
    with MemoryClient(cctx.settings) as mem:
        nid = mem.store(LONG, namespace="u", id="src")
        drain_all(cctx)
        ids = [construction.atom_id(nid, k) for k in (1, 2, 3)]
        shipping = "Apollo ships to the client in May, after a public beta on cheap phones."
        changed = f"{SENTENCE.split(LONG)[0]} {shipping}"
        assert len(changed) > cctx.settings.atomise_min_chars
        mem.store(changed, namespace="u", id=nid)
        drain_all(cctx)

        assert active(cctx, "u") == {nid, *ids[:2]}
        assert mem.get(ids[1], namespace="u").content == shipping
        assert mem.get(ids[0], namespace="u").version == 2
        assert [i for op, i in audit(cctx, "u") if op == "delete"] == [ids[2]]
        assert consistent(cctx, "u")

        chat.reply_with(Scripted("not json"))
        mem.store(LONG + " Twice.", namespace="u", id=nid)
        drain_all(cctx)

        assert active(cctx, "u") == {nid}  # the model failed: stored as one note
        assert mem.get(nid, namespace="u").kind == "note"
        deleted = [i for op, i in audit(cctx, "u") if op == "delete"]
        assert sorted(deleted) == sorted(ids)
        assert consistent(cctx, "u")


def test_deleting_a_source_deletes_its_atoms(cctx, chat):
    chat.reply_with(answer_with(describe))
    with MemoryClient(cctx.settings) as mem:
        nid = mem.store(LONG, namespace="del")
        keep = mem.store(NOTES[0], namespace="del")
        drain_all(cctx)
        assert len(active(cctx, "del")) == 5

        mem.delete(nid, namespace="del")
        drain_all(cctx)

        assert active(cctx, "del") == {keep}
        assert consistent(cctx, "del")
        deleted = [i for op, i in audit(cctx, "del") if op == "delete"]
        assert sorted(deleted) == sorted([nid, *(construction.atom_id(nid, k) for k in (1, 2, 3))])
