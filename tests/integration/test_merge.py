"""Near-duplicate merge through real Redis, real ingest and a real search server: the
survivor takes the access counts, links (both sides, larger weight) and metadata of the
other, which is tombstoned with merged_into and leaves the projection; get() of the merged id
returns the survivor; near-misses (other numbers, a negation, another event) stay apart."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgpack
import pytest

from producer import AsyncMemoryClient, MemoryClient, NotFound
from producer.protocol import unpack_link
from tests.conftest import drain_all
from worker.context import WorkerContext
from worker.organise import merge
from worker.organise.merge import merge_namespace
from worker.organise.periodic import last_runs, run_periodic
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace

FACT = "The customer's Snowflake account uses key-pair auth with Azure AD"
TWIN = "The customer Snowflake account uses key pair auth with Azure AD."
ROTATION = "Snowflake key-pair rotation for the customer account happens every 90 days"


@pytest.fixture
def served(ctx: WorkerContext) -> Iterator[MemoryClient]:
    srv = SearchServer(ctx).start()
    try:
        with MemoryClient(ctx.settings) as mem:
            yield mem
    finally:
        srv.stop()


def test_a_near_duplicate_is_merged_into_the_more_accessed_note(ctx, served):
    first = served.store(FACT, namespace="m", tags=["auth"], metadata={"source": "call-42"})
    rotation = served.store(ROTATION, namespace="m")
    twin = served.store(TWIN, namespace="m", tags=["sso"], metadata={"ticket": 7}, importance=0.9)
    drain_all(ctx)
    for _ in range(3):
        served.search("Azure AD key pair auth", namespace="m", k=1)  # touches one of the two
    counts = {i: served.get(i, namespace="m").access_count for i in (first, twin)}
    kept, gone = (first, twin) if counts[first] >= counts[twin] else (twin, first)
    links_before = {i: served.get(i, namespace="m").links for i in (first, twin)}

    assert merge_namespace(ctx, "m") == 1

    note = served.get(kept, namespace="m")
    assert note.id == kept and note.merged_from == [gone]
    assert note.access_count == sum(counts.values())
    assert {"auth", "sso"} <= set(note.tags)
    assert note.metadata == {"source": "call-42", "ticket": 7}
    assert note.importance == 0.9
    expected = {
        nb: max(w, links_before[kept].get(nb, 0.0))
        for nb, w in links_before[gone].items()
        if nb != kept
    }
    assert rotation in expected
    for nb, weight in expected.items():
        assert note.links[nb] == weight
        assert served.get(nb, namespace="m").links[kept] == weight
        assert gone not in served.get(nb, namespace="m").links
    assert served.get(gone, namespace="m").id == kept  # get() of the merged id: the survivor
    raw = ctx.redis.hgetall(ctx.keys.note("m", gone))
    assert raw[b"status"] == b"tombstoned" and raw[b"merged_into"] == kept.encode()
    hits = served.search("Snowflake Azure AD key pair auth", namespace="m", k=10)
    assert gone not in {h.id for h in hits} and kept in {h.id for h in hits}
    proj = ctx.projection("m")
    assert gone not in proj.ids.values() and kept in proj.ids.values()
    assert served.stats("m").notes == 2 and served.stats("m").tombstoned == 1
    assert check_namespace(ctx, "m") == []
    entries = [e for _, e in ctx.redis.xrange(ctx.keys.audit("m")) if e[b"op"] == b"merge"]
    assert {e[b"id"].decode() for e in entries} == {kept, gone}
    after = {e[b"id"].decode(): msgpack.unpackb(e[b"after"]) for e in entries}
    assert after[gone] == {"status": "tombstoned", "merged_into": kept}
    assert after[kept]["access_count"] == sum(counts.values())


def test_merge_is_incremental_and_idempotent(ctx, served):
    served.store(FACT, namespace="m")
    served.store(TWIN, namespace="m")
    drain_all(ctx)
    assert run_periodic(ctx, "merge") == 1
    audit_len = ctx.redis.xlen(ctx.keys.audit("m"))
    assert merge_namespace(ctx, "m") == 0
    assert run_periodic(ctx, "merge") == 0  # looks once more: the merge removed a note
    assert run_periodic(ctx, "merge") == 0
    assert last_runs(ctx)["merge"].namespaces == 0  # unchanged since: skipped
    assert ctx.redis.xlen(ctx.keys.audit("m")) == audit_len
    third = served.store(FACT + ".", namespace="m")
    drain_all(ctx)
    assert run_periodic(ctx, "merge") == 1
    assert served.stats("m").notes == 1
    assert served.get(third, namespace="m").id != third


def store_copies(mem: MemoryClient, ns: str, n: int) -> list[str]:
    return mem.store_many(
        ["The nightly backup of the billing database runs at 02:00."] * n, namespace=ns
    )


def test_one_run_merges_hundreds_of_identical_notes_into_one(ctx, served):
    ids = store_copies(served, "many", 300)
    drain_all(ctx)

    assert merge_namespace(ctx, "many") == 299

    (kept,) = {served.get(nid, namespace="many").id for nid in ids}
    assert served.stats("many").notes == 1 and served.stats("many").tombstoned == 299
    assert sorted(served.get(kept, namespace="many").merged_from) == sorted(set(ids) - {kept})
    assert check_namespace(ctx, "many") == []
    assert merge_namespace(ctx, "many") == 0


def test_merges_over_the_per_run_cap_are_left_to_the_next_runs(ctx, served, monkeypatch):
    monkeypatch.setattr(merge, "MAX_MERGES_PER_RUN", 40)
    store_copies(served, "cap", 100)
    drain_all(ctx)

    assert [merge_namespace(ctx, "cap") for _ in range(4)] == [40, 40, 19, 0]

    assert served.stats("cap").notes == 1
    assert check_namespace(ctx, "cap") == []


@pytest.mark.parametrize(
    ("a", "b", "times"),
    [
        (
            "Key rotation happens every 90 days.",
            "Key rotation happens every 30 days.",
            (None, None),
        ),
        (
            "The API is rate limited per tenant.",
            "The API is not rate limited per tenant.",
            (None, None),
        ),
        ("Standup moved to the small room.", "Standup moved to the small room.", (1.0e9, 1.1e9)),
        (FACT, "The customer's Snowflake account uses password auth with Azure AD", (None, None)),
    ],
)
def test_near_misses_are_not_merged(ctx, served, a, b, times):
    ids = [
        served.store(text, namespace="x", event_time=t)
        for text, t in zip((a, b), times, strict=True)
    ]
    drain_all(ctx)
    assert merge_namespace(ctx, "x") == 0
    assert [served.get(i, namespace="x").id for i in ids] == ids


def test_a_merged_note_that_superseded_another_hands_it_to_the_survivor(ctx, served):
    react = served.store("We chose React for the frontend.", namespace="s", event_time=1.0e9)
    switch = "We are switching the frontend to Svelte."
    first = served.store(switch, namespace="s", event_time=1.1e9)
    second = served.store(switch, namespace="s", event_time=1.1e9)
    drain_all(ctx)
    assert served.get(react, namespace="s").superseded_by == first
    ctx.redis.hincrby(ctx.keys.note("s", second), "access_count", 5)  # retrieved more often

    assert merge_namespace(ctx, "s") == 1

    assert served.get(first, namespace="s").id == second
    old = served.get(react, namespace="s")
    assert old.superseded_by == second and second in old.links and first not in old.links
    reason = unpack_link(ctx.redis.hget(ctx.keys.links("s", react), second))[1]["reason"]
    assert reason == "superseded_by"
    assert check_namespace(ctx, "s") == []


def test_storing_a_merged_id_again_brings_it_back_as_a_note_of_its_own(ctx, served):
    first = served.store(FACT, namespace="r")
    twin = served.store(TWIN, namespace="r")
    drain_all(ctx)
    assert merge_namespace(ctx, "r") == 1
    gone = twin if served.get(twin, namespace="r").id == first else first

    served.store("The customer now signs in with passkeys.", namespace="r", id=gone)
    drain_all(ctx)

    back = served.get(gone, namespace="r")
    assert back.id == gone and back.content == "The customer now signs in with passkeys."
    assert gone in {h.id for h in served.search("passkeys", namespace="r", k=5)}
    assert check_namespace(ctx, "r") == []


def test_a_merged_id_stored_again_then_deleted_is_not_found(ctx, served):
    first = served.store(FACT, namespace="d")
    twin = served.store(TWIN, namespace="d")
    drain_all(ctx)
    assert merge_namespace(ctx, "d") == 1
    gone = twin if served.get(twin, namespace="d").id == first else first
    kept = first if gone == twin else twin
    served.store("The customer now signs in with passkeys.", namespace="d", id=gone)
    drain_all(ctx)

    served.delete(gone, namespace="d")
    drain_all(ctx)

    with pytest.raises(NotFound):
        served.get(gone, namespace="d")
    assert served.get(kept, namespace="d").id == kept
    assert b"merged_into" not in ctx.redis.hgetall(ctx.keys.note("d", gone))
    assert check_namespace(ctx, "d") == []


def test_the_async_client_follows_a_merged_id_too(ctx, settings):
    async def scenario() -> None:
        async with AsyncMemoryClient(settings) as mem:
            first = await mem.store(FACT, namespace="a")
            twin = await mem.store(TWIN, namespace="a")
            drain_all(ctx)
            assert merge_namespace(ctx, "a") == 1
            notes = [await mem.get(i, namespace="a") for i in (first, twin)]
            assert notes[0].id == notes[1].id == first  # equal access counts: the older stays
            await mem.delete(first, namespace="a")
            drain_all(ctx)
            with pytest.raises(NotFound):
                await mem.get(twin, namespace="a")

    asyncio.run(scenario())
