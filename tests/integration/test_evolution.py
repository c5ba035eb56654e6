"""Evolution through real Redis and real ingest: neighbours' tags change in apply mode (audited),
wait for accept in propose mode, stay put when rejected, come back exactly on revert; a review
never clobbers a later write; off changes nothing; the LLM path maps answers back through the
numbers shown only and fails closed."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import msgpack
import pytest

from producer import (
    AsyncMemoryClient,
    Conflict,
    InvalidInput,
    MemoryClient,
    NotFound,
    ReplyTimeout,
)
from tests.conftest import drain_all, make_settings
from tests.integration.chat_server import ChatServer, Scripted, answer, chat
from worker.cli import main as cli
from worker.context import WorkerContext
from worker.organise.evolution import evolve_namespace
from worker.organise.periodic import last_runs, run_periodic
from worker.organise.proposals import expire_settled
from worker.store.integrity import check_namespace
from worker.store.lease import Lease

__all__ = ["chat"]

NS = "evo"
#: a and b carry the caller tag "billing"; n, linked to both, does not
SEED = {
    "a": ("Snowflake warehouse credits spike every Monday morning", ["billing"]),
    "b": ("Snowflake warehouse credits are billed per second of compute", ["billing"]),
    "n": ("The Snowflake warehouse suspends after five idle minutes to save credits", []),
}


def build(tmp_path, **overrides) -> WorkerContext:
    return WorkerContext.build(make_settings(tmp_path, sequence_weight=0.0, **overrides))


@pytest.fixture
def apply_ctx(redis_db, tmp_path) -> Iterator[WorkerContext]:
    ctx = build(tmp_path, evolution="apply")
    yield ctx
    ctx.close()


@pytest.fixture
def propose_ctx(redis_db, tmp_path) -> Iterator[WorkerContext]:
    ctx = build(tmp_path, evolution="propose")
    yield ctx
    ctx.close()


def seed(ctx: WorkerContext, mem: MemoryClient, ns: str = NS) -> None:
    for nid, (content, tags) in SEED.items():
        mem.store(content, namespace=ns, tags=tags, id=nid)
    drain_all(ctx)


def note_hash(ctx: WorkerContext, nid: str, ns: str = NS) -> dict[bytes, bytes]:
    return ctx.redis.hgetall(ctx.keys.note(ns, nid))


def audit(ctx: WorkerContext, ns: str = NS) -> list[dict[str, object]]:
    return [
        {
            "op": e[b"op"].decode(),
            "id": e[b"id"].decode(),
            "actor": e[b"actor"].decode(),
            "source": e[b"source"].decode(),
            "before": msgpack.unpackb(e[b"before"]),
            "after": msgpack.unpackb(e[b"after"]),
        }
        for _, e in ctx.redis.xrange(ctx.keys.audit(ns))
    ]


def evolution_ops(ctx: WorkerContext, ns: str = NS) -> list[tuple[object, object]]:
    return [(e["op"], e["id"]) for e in audit(ctx, ns) if str(e["op"]).startswith("evolve")]


def test_apply_mode_gives_a_neighbour_its_neighbours_tag_and_audits_it(apply_ctx):
    with MemoryClient(apply_ctx.settings) as mem:
        seed(apply_ctx, mem)
        before = mem.get("n", namespace=NS)

        assert evolve_namespace(apply_ctx, NS) == 1

        after = mem.get("n", namespace=NS)
        assert after.tags[: len(before.tags)] == before.tags and "billing" in after.tags
        assert after.version == before.version + 1
        assert after.content == before.content and after.links == before.links
        ((p),) = mem.proposals(NS)
        assert (p.note, p.status, p.source, p.fields) == ("n", "applied", "rule", ["tags"])
        assert p.before == {"tags": before.tags} and p.after == {"tags": after.tags}
        assert "billing on 2 of 2 neighbours" in p.reason
        assert set(p.triggers) <= set(SEED) and all(b.startswith("inbox:") for b in p.batch)
        ((entry),) = [e for e in audit(apply_ctx) if e["op"] == "evolve"]
        assert entry["id"] == "n" and entry["source"] == f"rule proposal:{p.id}"
        assert entry["before"] == {"tags": before.tags, "version": before.version}
        assert entry["after"] == {"tags": after.tags, "version": after.version}
        assert int(apply_ctx.redis.hget(apply_ctx.keys.stats(NS), "evolve_applied")) == 1
        assert "evolve" in mem.stats(NS).last

        assert evolve_namespace(apply_ctx, NS) == 0  # the same triggers are not evolved twice
        assert check_namespace(apply_ctx, NS) == []


def test_off_mode_changes_nothing(redis_db, tmp_path):
    ctx = build(tmp_path)
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem)
            hashes = {nid: note_hash(ctx, nid) for nid in SEED}
            audit_len = ctx.redis.xlen(ctx.keys.audit(NS))

            assert evolve_namespace(ctx, NS) == 0 and run_periodic(ctx, "evolve") == 0

            assert {nid: note_hash(ctx, nid) for nid in SEED} == hashes
            assert ctx.redis.xlen(ctx.keys.audit(NS)) == audit_len
            assert not ctx.redis.exists(ctx.keys.evolved(NS))
            assert mem.proposals(NS) == []
    finally:
        ctx.close()


def test_propose_mode_leaves_the_note_until_accepted(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        seed(propose_ctx, mem)
        untouched = note_hash(propose_ctx, "n")

        assert evolve_namespace(propose_ctx, NS) == 1

        assert note_hash(propose_ctx, "n") == untouched
        ((p),) = mem.proposals(NS, status="pending")
        assert p.note == "n" and "billing" in p.after["tags"]
        assert evolution_ops(propose_ctx) == [("evolve-propose", "n")]

        accepted = mem.accept(p.id, namespace=NS, agent="reviewer")

        assert accepted.status == "applied"
        note = mem.get("n", namespace=NS)
        assert note.tags == p.after["tags"] and note.version == int(untouched[b"version"]) + 1
        assert mem.proposals(NS, status="pending") == []
        assert [q.id for q in mem.proposals(NS, status="applied")] == [p.id]
        last = audit(propose_ctx)[-1]
        assert (last["op"], last["id"], last["actor"]) == ("evolve-accept", "n", "reviewer")
        assert last["after"] == {"tags": note.tags, "version": note.version}
        with pytest.raises(Conflict):
            mem.accept(p.id, namespace=NS)


def test_a_rejected_proposal_leaves_the_note_as_it_was(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        seed(propose_ctx, mem)
        untouched = note_hash(propose_ctx, "n")
        evolve_namespace(propose_ctx, NS)
        ((p),) = mem.proposals(NS)

        assert mem.reject(p.id, namespace=NS).status == "rejected"

        assert note_hash(propose_ctx, "n") == untouched
        assert evolution_ops(propose_ctx)[-1] == ("evolve-reject", "n")
        with pytest.raises(Conflict):
            mem.accept(p.id, namespace=NS)
        with pytest.raises(Conflict):
            mem.revert(p.id, namespace=NS)
        assert note_hash(propose_ctx, "n") == untouched


def test_a_revert_restores_the_exact_previous_state(apply_ctx):
    with MemoryClient(apply_ctx.settings) as mem:
        seed(apply_ctx, mem)
        previous = note_hash(apply_ctx, "n")
        evolve_namespace(apply_ctx, NS)
        ((p),) = mem.proposals(NS)
        assert note_hash(apply_ctx, "n") != previous

        reverted = mem.revert(p.id, namespace=NS, agent="reviewer")

        assert reverted.status == "reverted"
        assert note_hash(apply_ctx, "n") == previous
        last = audit(apply_ctx)[-1]
        assert (last["op"], last["id"]) == ("evolve-revert", "n")
        assert last["after"] == {"tags": p.before["tags"], "version": int(previous[b"version"])}
        with pytest.raises(Conflict):
            mem.revert(p.id, namespace=NS)
        assert note_hash(apply_ctx, "n") == previous


def test_a_revert_after_a_later_write_is_refused_and_keeps_that_write(apply_ctx):
    with MemoryClient(apply_ctx.settings) as mem:
        seed(apply_ctx, mem)
        evolve_namespace(apply_ctx, NS)
        ((p),) = mem.proposals(NS)
        mem.store(SEED["n"][0], namespace=NS, tags=["ops"], id="n")
        drain_all(apply_ctx)
        rewritten = note_hash(apply_ctx, "n")

        with pytest.raises(Conflict, match="changed since"):
            mem.revert(p.id, namespace=NS)

        assert note_hash(apply_ctx, "n") == rewritten
        assert mem.get("n", namespace=NS).tags[0] == "ops"
        assert [q.status for q in mem.proposals(NS)] == ["applied"]


def test_an_accept_after_a_later_write_is_refused(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        seed(propose_ctx, mem)
        evolve_namespace(propose_ctx, NS)
        ((p),) = mem.proposals(NS)
        mem.store(SEED["n"][0] + " Weekends too.", namespace=NS, id="n")
        drain_all(propose_ctx)
        rewritten = note_hash(propose_ctx, "n")

        with pytest.raises(Conflict):
            mem.accept(p.id, namespace=NS)

        assert note_hash(propose_ctx, "n") == rewritten
        assert mem.reject(p.id, namespace=NS).status == "rejected"


def test_a_note_with_a_pending_proposal_gets_no_second_one(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        seed(propose_ctx, mem)
        evolve_namespace(propose_ctx, NS)
        mem.store(
            "Snowflake warehouse credits run out at month end", namespace=NS, tags=["billing"]
        )
        drain_all(propose_ctx)

        evolve_namespace(propose_ctx, NS)

        assert [p.note for p in mem.proposals(NS, status="pending")].count("n") == 1
        assert int(propose_ctx.redis.hget(propose_ctx.keys.stats(NS), "evolve_stale")) >= 1


MORE_BILLING = "Snowflake warehouse credits run out at month end"


@pytest.mark.parametrize("mode", ["propose", "apply"])
def test_tags_a_reviewer_refused_are_not_proposed_again(redis_db, tmp_path, mode):
    ctx = build(tmp_path, evolution=mode)
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem)
            evolve_namespace(ctx, NS)
            ((p),) = mem.proposals(NS)
            refused = set(p.after["tags"]) - set(p.before["tags"])
            (mem.reject if mode == "propose" else mem.revert)(p.id, namespace=NS)
            mem.store(MORE_BILLING, namespace=NS, tags=["billing"], id="more")
            drain_all(ctx)
            assert "n" in mem.get("more", namespace=NS).links

            evolve_namespace(ctx, NS)

            later = [q for q in mem.proposals(NS) if q.note == "n" and q.id != p.id]
            assert all(not refused & set(q.after["tags"]) for q in later)
            assert refused.isdisjoint(mem.get("n", namespace=NS).tags)
    finally:
        ctx.close()


def test_a_deleted_note_takes_its_refused_tags_with_it(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        seed(propose_ctx, mem)
        evolve_namespace(propose_ctx, NS)
        ((p),) = mem.proposals(NS)
        mem.reject(p.id, namespace=NS)
        assert propose_ctx.redis.hexists(propose_ctx.keys.refused(NS), "n")

        mem.delete("n", namespace=NS)
        drain_all(propose_ctx)

        assert not propose_ctx.redis.hexists(propose_ctx.keys.refused(NS), "n")


def test_a_review_waits_for_the_namespace_lock(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        seed(propose_ctx, mem)
        evolve_namespace(propose_ctx, NS)
        ((p),) = mem.proposals(NS)
        untouched = note_hash(propose_ctx, "n")
        lock = Lease(propose_ctx.redis, propose_ctx.keys.lock(NS), 30.0, owner="test")
        assert lock.acquire()
        with MemoryClient(propose_ctx.settings, reply_timeout_s=0.2) as impatient:
            with pytest.raises(ReplyTimeout):
                impatient.accept(p.id, namespace=NS)
        assert note_hash(propose_ctx, "n") == untouched
        lock.release()

        assert mem.accept(p.id, namespace=NS).status == "applied"


def test_bad_review_input_gets_a_typed_error(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        with pytest.raises(NotFound):
            mem.accept("no-such-proposal", namespace=NS)
        with pytest.raises(InvalidInput):
            mem.revert("bad id!", namespace=NS)
        with pytest.raises(InvalidInput):
            mem.proposals(NS, status="maybe")
        with pytest.raises(InvalidInput):
            mem.proposals(NS, limit=0)


def test_evolution_stays_inside_its_namespace(apply_ctx):
    with MemoryClient(apply_ctx.settings) as mem:
        seed(apply_ctx, mem, "other")
        seed(apply_ctx, mem)

        assert run_periodic(apply_ctx, "evolve") == 2

        for ns in (NS, "other"):
            assert [p.note for p in mem.proposals(ns)] == ["n"]
            assert all(p.namespace == ns for p in mem.proposals(ns))
        assert run_periodic(apply_ctx, "evolve") == 0  # the productive run's second look
        assert run_periodic(apply_ctx, "evolve") == 0
        assert last_runs(apply_ctx)["evolve"].namespaces == 0  # nothing written since


def test_the_async_client_reviews_proposals(propose_ctx):
    with MemoryClient(propose_ctx.settings) as mem:
        seed(propose_ctx, mem)
    evolve_namespace(propose_ctx, NS)
    previous = note_hash(propose_ctx, "n")

    async def scenario() -> None:
        async with AsyncMemoryClient(propose_ctx.settings) as amem:
            ((p),) = await amem.proposals(NS, status="pending")
            assert (await amem.accept(p.id, namespace=NS)).status == "applied"
            assert (await amem.revert(p.id, namespace=NS)).status == "reverted"
            with pytest.raises(Conflict):
                await amem.reject(p.id, namespace=NS)

    asyncio.run(scenario())
    assert note_hash(propose_ctx, "n") == previous


def test_the_cli_lists_and_reviews_proposals(propose_ctx, monkeypatch, capsys):
    s = propose_ctx.settings
    for name, value in (("REDIS_URL", s.redis_url), ("KEY_PREFIX", s.key_prefix)):
        monkeypatch.setenv(f"ZQ_{name}", value)
    monkeypatch.setenv("ZQ_SHARD_COUNT", str(s.shard_count))
    with MemoryClient(s) as mem:
        seed(propose_ctx, mem)
    evolve_namespace(propose_ctx, NS)

    assert cli.main(["proposals", "list", "-n", NS, "--status", "pending", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["note"] for p in listed] == ["n"]
    assert cli.main(["proposals", "accept", listed[0]["id"], "-n", NS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "applied"
    assert cli.main(["proposals", "reject", listed[0]["id"], "-n", NS]) == 1
    assert capsys.readouterr().err.startswith("zettelq: error: reject refused: ")


def llm_build(tmp_path, url: str, mode: str = "apply") -> WorkerContext:
    return build(tmp_path, evolution=mode, llm_url=url, llm_timeout_s=2.0, llm_model="m1")


def shown_notes(prompt: str, contents: dict[str, str]) -> dict[int, str]:
    """Prompt number -> the note whose content is shown under it."""
    found = re.findall(r"^\[(\d+)\] .*\n {4}(.*)$", prompt, re.M)
    by_content = {text: nid for nid, text in contents.items()}
    return {int(n): by_content[text] for n, text in found}


def test_the_model_proposes_for_the_notes_it_was_shown_by_number(
    redis_db, tmp_path, chat: ChatServer
):
    ctx = llm_build(tmp_path, chat.url)
    try:
        with MemoryClient(ctx.settings) as mem:
            mem.store(SEED["a"][0], namespace=NS, id="a")
            drain_all(ctx)
            mem.store(SEED["b"][0], namespace=NS, id="b")
            drain_all(ctx)
            mem.store(SEED["n"][0], namespace=NS, id="n")
            drain_all(ctx)
            chat.reply_with(
                answer({"changes": [{"note": 2, "add_tags": ["cost"], "context": "x"}]})
            )
            untouched = {nid: note_hash(ctx, nid) for nid in SEED}

            written = evolve_namespace(ctx, NS)

            assert len(chat.requests) == 1  # one call for every neighbour of the run
            prompt = chat.requests[0]["messages"][1]["content"]
            shown = shown_notes(prompt, {nid: text for nid, (text, _) in SEED.items()})
            assert len(shown) >= 2
            target = shown[2]
            assert written == 1
            ((p),) = mem.proposals(NS)
            assert (p.note, p.source) == (target, "model:m1")
            note = mem.get(target, namespace=NS)
            assert note.tags[-1] == "cost" and note.context == "x"
            for nid in set(SEED) - {target}:
                assert note_hash(ctx, nid) == untouched[nid]
    finally:
        ctx.close()


@pytest.mark.parametrize(
    "reply, reason",
    [
        (answer({"changes": [{"note": 9, "add_tags": ["cost"]}]}), "llm_fail_unknown_id"),
        (Scripted("not json at all"), "llm_fail_malformed"),
        (answer({"changes": [{"note": 1}, {"note": 1, "context": "twice"}]}), "llm_fail_schema"),
    ],
)
def test_a_bad_model_answer_changes_nothing(redis_db, tmp_path, chat: ChatServer, reply, reason):
    ctx = llm_build(tmp_path, chat.url)
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem)
            chat.reply_with(reply)
            hashes = {nid: note_hash(ctx, nid) for nid in SEED}

            assert evolve_namespace(ctx, NS) == 0

            assert len(chat.requests) == 1
            assert {nid: note_hash(ctx, nid) for nid in SEED} == hashes
            assert mem.proposals(NS) == []
            assert int(ctx.redis.hget(ctx.keys.stats(NS), reason)) == 1
            assert evolution_ops(ctx) == []
    finally:
        ctx.close()


def test_settled_proposals_are_deleted_after_their_retention_and_pending_ones_kept(
    redis_db, tmp_path
):
    ctx = build(tmp_path, evolution="propose", proposal_retention_days=1.0)
    try:
        with MemoryClient(ctx.settings) as mem:
            for ns in (NS, "other"):
                seed(ctx, mem, ns)
                evolve_namespace(ctx, ns)
            ((settled),) = mem.proposals(NS)
            ((pending),) = mem.proposals("other")
            mem.reject(settled.id, namespace=NS)
            later = time.time() + 2 * 86_400

            young = evolve_namespace(ctx, NS)  # the rejection is seconds old: kept
            gone = [expire_settled(ctx, ns, later) for ns in (NS, "other")]

            assert young == 0 and gone == [1, 0]
            assert mem.proposals(NS) == [] and mem.proposals("other") == [pending]
            assert not ctx.redis.exists(ctx.keys.proposal(NS, settled.id))
            assert not ctx.redis.exists(ctx.keys.proposals(NS, "rejected"))
            assert expire_settled(ctx, NS, later) == 0
    finally:
        ctx.close()
