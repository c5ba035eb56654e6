"""worker.notes against the real Redis."""

from __future__ import annotations

import msgpack
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
