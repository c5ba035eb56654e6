"""Fault injection: evolution changes notes while a real `zettelq worker` process ingests into the
same namespace — re-stores of the very notes evolution changes, and new notes linking to them.
In "apply" mode the worker-side evolution writes; in "propose" mode a reviewer thread accepts
and reverts proposals through the client's review script at the same time.

No update may be lost. Every write of a note (ingest's create/update, evolution's evolve, a
review's accept/revert) is audited in the same atomic step as the write itself, with the note's
version and tags before and after, so each note's audit trail must be one unbroken chain: each
write starts from exactly the state the previous one left (a write computed from a stale read
would not), and the note's hash holds the last state, with the content stored last. Links stay
two-sided and valid.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import msgpack
import pytest

from producer import Conflict, MemoryClient
from tests.e2e.workers import running, wait_until
from worker.context import WorkerContext
from worker.organise.evolution import evolve_namespace
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

NS = "evolving"
ROUNDS = 5
INGEST = frozenset({"create", "update"})
EVOLUTION = frozenset({"evolve", "evolve-accept", "evolve-revert"})
#: topic -> notes; the first three carry the topic as a caller tag, the fourth does not (so
#: evolution has a tag to spread to it, again after every re-store resets its tags)
TOPICS = {
    "billing": [
        "Snowflake warehouse credits spike every Monday morning",
        "Snowflake warehouse credits are billed per second of compute",
        "Snowflake warehouse credits for the analytics team are capped monthly",
        "The Snowflake warehouse suspends after five idle minutes to save credits",
    ],
    "oncall": [
        "Kubernetes pods of the ingest service restart when memory runs out",
        "Kubernetes pods of the ingest service page the oncall engineer on restart",
        "Kubernetes pods of the ingest service get a memory limit of two gigabytes",
        "The ingest service pods on Kubernetes drain their queue before a restart",
    ],
}

Step = Callable[[WorkerContext, MemoryClient], int]  #: one evolution pass; returns writes made


def seeds() -> dict[str, tuple[str, list[str]]]:
    return {
        f"{topic}-{i}": (text, [topic] if i < 3 else [])
        for topic, texts in TOPICS.items()
        for i, text in enumerate(texts)
    }


def apply_step(ctx: WorkerContext, mem: MemoryClient) -> int:
    return evolve_namespace(ctx, NS)


def review_step(ctx: WorkerContext, mem: MemoryClient) -> int:
    """Propose, then accept every pending proposal and revert every other one accepted (a
    refused step is rejected or left, as a reviewer would)."""
    evolve_namespace(ctx, NS)
    done = 0
    for i, p in enumerate(mem.proposals(NS, status="pending")):
        try:
            mem.accept(p.id, namespace=NS, agent="reviewer")
        except Conflict:
            mem.reject(p.id, namespace=NS, agent="reviewer")
            continue
        done += 1
        if i % 2:
            try:
                mem.revert(p.id, namespace=NS, agent="reviewer")
                done += 1
            except Conflict:
                pass
    return done


@pytest.mark.parametrize(("mode", "step"), [("apply", apply_step), ("propose", review_step)])
def test_concurrent_evolution_and_ingest_never_lose_an_update(
    own_settings: WorkerSettings, mode: str, step: Step
):
    settings = own_settings.model_copy(update={"evolution": mode, "sequence_weight": 0.0})
    ctx = WorkerContext.build(settings)
    try:
        with running(settings, ZQ_SEQUENCE_WEIGHT="0"), MemoryClient(settings) as mem:
            last_content = ingest_while_evolving(ctx, mem, step)

        orders = [check_trail(ctx, nid, content) for nid, content in last_content.items()]

        pairs = [pair for order in orders for pair in order]
        assert any(a in INGEST and b in EVOLUTION for a, b in pairs)  # evolution after ingest
        assert any(a in EVOLUTION and b in INGEST for a, b in pairs)  # and ingest after it
        if mode == "propose":
            assert any(b == "evolve-revert" for _, b in pairs)
        assert check_namespace(ctx, NS) == []
    finally:
        ctx.close()


def ingest_while_evolving(ctx: WorkerContext, mem: MemoryClient, step: Step) -> dict[str, str]:
    """Seed, then ROUNDS rounds of re-stores and new linked notes while a thread runs ``step``
    continuously; each round waits for its notes to be organised and for a whole pass of
    ``step`` begun after that (not for a write: a reviewer's rejects and reverts refuse tags for
    good, so later rounds may leave evolution nothing to propose). Return each seed id's last
    stored content."""
    last_content: dict[str, str] = {}
    for nid, (text, tags) in seeds().items():
        mem.store(text, namespace=NS, tags=tags, id=nid)
        last_content[nid] = text
    mem.flush(NS, timeout_s=60)
    stop = threading.Event()
    done = [0, 0]  #: writes made, passes finished
    errors: list[BaseException] = []
    evolver = threading.Thread(
        target=evolve_until, args=(ctx, mem, step, stop, done, errors), daemon=True
    )
    evolver.start()
    try:
        for r in range(ROUNDS):
            for nid, (text, tags) in seeds().items():
                last_content[nid] = f"{text} (revision {r})"
                mem.store(last_content[nid], namespace=NS, tags=tags, id=nid)
            for topic, texts in TOPICS.items():
                mem.store(f"{texts[0]} and again in round {r}", namespace=NS, tags=[topic])
            mem.flush(NS, timeout_s=60)
            passes = done[1]
            wait_until(lambda passes=passes: done[1] > passes + 1 or bool(errors), timeout_s=60)
        assert done[0] > 0
    finally:
        stop.set()
        evolver.join(60)
    assert not errors, errors
    return last_content


def evolve_until(
    ctx: WorkerContext,
    mem: MemoryClient,
    step: Step,
    stop: threading.Event,
    done: list[int],
    errors: list[BaseException],
) -> None:
    try:
        while not stop.is_set():
            written = step(ctx, mem)
            done[0] += written
            done[1] += 1
            if not written:
                stop.wait(0.02)
    except BaseException as exc:  # handed to the test thread, which fails on it
        errors.append(exc)


def trail(ctx: WorkerContext, nid: str) -> list[tuple[str, dict[str, object], dict[str, object]]]:
    """(op, before, after) of every write of ``nid``, in commit order."""
    return [
        (e[b"op"].decode(), msgpack.unpackb(e[b"before"]), msgpack.unpackb(e[b"after"]))
        for _, e in ctx.redis.xrange(ctx.keys.audit(NS))
        if e[b"id"].decode() == nid and e[b"op"].decode() in INGEST | EVOLUTION
    ]


def check_trail(ctx: WorkerContext, nid: str, content: str) -> list[tuple[str, str]]:
    """Assert that the writes of ``nid`` form one unbroken chain of states ending in its stored
    state; return the (op, next op) pairs of the chain."""
    writes = trail(ctx, nid)
    ops = [op for op, _, _ in writes]
    assert ops[0] == "create" and writes[0][2]["version"] == 1, (nid, ops)
    for (_, _, prev), (op, before, after) in itertools.pairwise(writes):
        # ingest's audit "before" carries the version as read from the hash (a string)
        assert int(before["version"]) == prev["version"], (nid, ops)
        assert before["tags"] == prev["tags"], (nid, ops)
        step = -1 if op == "evolve-revert" else 1
        assert after["version"] == int(before["version"]) + step, (nid, ops)
    raw = ctx.redis.hmget(ctx.keys.note(NS, nid), ["version", "tags", "content"])
    assert int(raw[0]) == writes[-1][2]["version"]
    assert msgpack.unpackb(raw[1]) == writes[-1][2]["tags"]
    assert raw[2].decode() == content
    return list(itertools.pairwise(ops))
