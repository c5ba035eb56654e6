"""worker.notes against the real Redis."""

from __future__ import annotations

import msgpack
import pytest
from redis import Redis

from producer.keys import Keys
from worker import notes
from worker.bulk import BulkTransaction, pairs
from worker.linking import Link


def test_write_links_writes_both_sides_with_label_and_source(redis_db: Redis) -> None:
    keys = Keys("t")
    count = 2_005
    links = [Link("hub", f"n{i}", 0.5, f"reason {i}") for i in range(count)]
    links.append(Link("n0", "n1", 0.25, "pair", "supports", "model:x"))
    pipe = BulkTransaction(redis_db)

    written = notes.write_links(pipe, keys, "ns", links, source="rule:similarity")
    pipe.execute()

    assert written == count + 1
    assert redis_db.zcard(keys.links("ns", "hub")) == count
    assert redis_db.zscore(keys.links("ns", "n7"), "hub") == 0.5
    assert redis_db.zrange(keys.links("ns", "n1"), 0, -1, withscores=True) == [
        (b"n0", 0.25),
        (b"hub", 0.5),
    ]
    hub_meta = pairs(redis_db.execute_command("HGETALL", keys.linkmeta("ns", "hub")))
    assert len(hub_meta) == count
    meta = msgpack.unpackb(hub_meta[f"n{count - 1}"])
    assert (meta["reason"], meta["label"], meta["source"]) == (
        f"reason {count - 1}",
        "related",
        "rule:similarity",
    )
    pair = notes.link_meta(redis_db.hget(keys.linkmeta("ns", "n1"), "n0"))
    assert (pair["reason"], pair["label"], pair["source"]) == ("pair", "supports", "model:x")


@pytest.mark.parametrize("degree", [5, 300])
def test_read_links_returns_every_link_with_its_weight(
    redis_db: Redis, monkeypatch: pytest.MonkeyPatch, degree: int
) -> None:
    """A link set past LINKS_SCAN (too large for one ZSCAN reply) is read again whole."""
    monkeypatch.setattr(notes, "LINKS_SCAN", 50)
    keys = Keys("t")
    links = {f"n{i:03d}": round(0.1 + i / 1000, 4) for i in range(degree)}
    redis_db.zadd(keys.links("ns", "a"), links)

    got = notes.read_links(redis_db, keys, "ns", ["a", "none"])

    assert got == {"a": links, "none": {}}
