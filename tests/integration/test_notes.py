"""worker.store.notes against the real Redis."""

from __future__ import annotations

import pytest
from redis import Redis

from producer.keys import Keys
from producer.protocol import link_meta, link_weight, note_from_hash, pack_link, unpack_link
from tests.conftest import drain_all
from worker.bulk import BulkTransaction, fields
from worker.store import notes
from worker.store.notes import Link


def test_write_links_writes_both_sides_with_label_and_source(redis_db: Redis) -> None:
    keys = Keys("t")
    count = 2_005
    links = [Link("hub", f"n{i}", 0.5, f"reason {i}") for i in range(count)]
    links.append(Link("n0", "n1", 0.25, "pair", "supports", "model:x"))
    pipe = BulkTransaction(redis_db)

    written = notes.write_links(pipe, keys, "ns", links, source="rule:similarity")
    pipe.execute()

    assert written == count + 1
    assert redis_db.hlen(keys.links("ns", "hub")) == count
    assert link_weight(redis_db.hget(keys.links("ns", "n7"), "hub")) == 0.5
    assert notes.read_links(redis_db, keys, "ns", ["n1"])["n1"] == {"n0": 0.25, "hub": 0.5}
    hub = fields(redis_db.execute_command("HGETALL", keys.links("ns", "hub")))
    assert len(hub) == count
    weight, meta = unpack_link(hub[f"n{count - 1}".encode()])
    assert (weight, meta["reason"], meta["label"], meta["source"]) == (
        0.5,
        f"reason {count - 1}",
        "related",
        "rule:similarity",
    )
    for a, b in (("n1", "n0"), ("n0", "n1")):  # the same metadata on both ends
        pair = link_meta(redis_db.hget(keys.links("ns", a), b))
        assert (pair["reason"], pair["label"], pair["source"]) == ("pair", "supports", "model:x")


@pytest.mark.parametrize("degree", [5, 300])
def test_read_links_returns_every_link_with_its_weight(redis_db: Redis, degree: int) -> None:
    """Listpack or hashtable (past 128 fields), a links hash comes back whole."""
    keys = Keys("t")
    links = {f"n{i:03d}": round(0.1 + i / 1000, 4) for i in range(degree)}
    redis_db.hset(keys.links("ns", "a"), mapping={nb: pack_link(w, {}) for nb, w in links.items()})

    got = notes.read_links(redis_db, keys, "ns", ["a", "none"])

    assert got == {"a": links, "none": {}}


def test_a_note_leaves_out_fields_at_their_default_and_an_update_to_them_deletes_them(
    ctx, client
) -> None:
    plain = client.store("A plain note with no agent.", namespace="d")
    told = client.store("A note told by Bob.", namespace="d", agent="bob", metadata={"k": 1})
    drain_all(ctx)
    raw = ctx.redis.hgetall(ctx.keys.note("d", plain))
    assert not {b"agent", b"event_time", b"metadata"} & set(raw)
    assert {b"agent", b"metadata"} <= set(ctx.redis.hgetall(ctx.keys.note("d", told)))
    for nid in (plain, told):
        client.store("Now nobody's note.", namespace="d", id=nid)
    drain_all(ctx)

    for nid in (plain, told):
        raw = ctx.redis.hgetall(ctx.keys.note("d", nid))
        assert not {b"agent", b"event_time", b"metadata"} & set(raw)
        note = client.get(nid, namespace="d")
        assert (note.agent, note.event_time, note.metadata, note.version) == (None, None, {}, 2)
        unpacked = notes.unpack_fields(raw)
        assert (unpacked["agent"], unpacked["event_time"], unpacked["metadata"]) == (None, None, {})


def test_a_note_hash_that_holds_its_defaults_reads_as_one_that_leaves_them_out() -> None:
    written = notes.encode_fields(
        {"id": "n1", "namespace": "d", "content": "c", "seq": 3, "agent": None, "event_time": None}
        | {"metadata": {}, "status": "active"}
    )
    old = {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in written.items()}
    new = {k: v for k, v in old.items() if k not in (b"agent", b"event_time", b"metadata")}
    assert len(new) == len(old) - 3
    assert notes.unpack_fields(old) == notes.unpack_fields(new)
    assert note_from_hash(old) == note_from_hash(new)
    erased = {b"id": b"n1", b"seq": b"3", b"status": b"tombstoned"}  # content erased
    assert notes.left_out(erased) == {"access_count": 0, "last_access": 0.0}
    assert notes.left_out({b"id": b"n2", b"status": b"tombstoned"}) == {}  # a delete's fence
