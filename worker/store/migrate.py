"""``zettelq migrate``: upgrade a store written before a note's links became one hash.

Until 2026-12-01 each end of a link was kept in two keys: ``P:{ns}:links:<id>``, a sorted set of
neighbour -> weight, and ``P:{ns}:linkmeta:<id>``, a hash of neighbour -> msgpack metadata. Now
``P:{ns}:links:<id>`` is a hash of neighbour -> packed link (``producer.protocol.pack_link``)
and there is no linkmeta key. A worker reading the old layout fails with WRONGTYPE, so run this
once, with every worker stopped: it refuses while any shard lease is held. Each note is converted
in its own MULTI/EXEC; a run that stops half-way can simply be run again, since notes already in
the new layout are left alone.

It also deletes each namespace's ``P:{ns}:seqs`` hash (seq -> note id), which builds before
2026-12-07 wrote with every note and nothing ever read: about 100 bytes per note.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import msgpack

from producer.protocol import pack_link
from worker.context import WorkerContext
from worker.errors import MigrationRefused
from worker.store.notes import changed

log = logging.getLogger(__name__)

SCAN_COUNT = 1_000  #: keys per SCAN step
SEQS_SUFFIX = "}:seqs"  #: how the key of a namespace's old seq -> id hash ends


@dataclass
class Migrated:
    notes: int = 0  #: link sets converted
    links: int = 0  #: link ends converted
    orphans: int = 0  #: linkmeta hashes without a link set, deleted
    seq_maps: int = 0  #: unused seq -> id hashes, deleted
    per_namespace: dict[str, int] = field(default_factory=dict)  #: link sets converted


def migrate_links(ctx: WorkerContext) -> Migrated:
    """Convert every note's old link keys, in one SCAN of the keyspace (then one more for
    linkmeta hashes left without a link set)."""
    r, keys = ctx.redis, ctx.keys
    held = [s for s in range(keys.shard_count) if r.exists(keys.lease(s))]
    if held:
        raise MigrationRefused(f"shard leases held for shards {held}: stop every worker first")
    out = Migrated()
    for key in r.scan_iter(match=f"{keys.prefix}:{{*}}:links:*", count=SCAN_COUNT, _type="zset"):
        head, note_id = key.decode().rsplit(":links:", 1)
        ns = head[len(keys.prefix) + 2 : -1]
        out.links += _convert(ctx, ns, key, f"{head}:linkmeta:{note_id}")
        out.notes += 1
        out.per_namespace[ns] = out.per_namespace.get(ns, 0) + 1
    pattern = f"{keys.prefix}:{{*}}:linkmeta:*"
    for key in r.scan_iter(match=pattern, count=SCAN_COUNT, _type="hash"):
        out.orphans += r.delete(key)
    for key in r.scan_iter(match=f"{keys.prefix}:{{*{SEQS_SUFFIX}", count=SCAN_COUNT, _type="hash"):
        ns = key.decode()[len(keys.prefix) + 2 : -len(SEQS_SUFFIX)]
        if "}" not in ns:  # the pattern's * also matches a note key whose id ends so
            out.seq_maps += r.delete(key)
    log.info(
        "migrated %d link sets (%d link ends) in %d namespaces; deleted %d seq maps",
        *(out.notes, out.links, len(out.per_namespace), out.seq_maps),
    )
    return out


def _convert(ctx: WorkerContext, ns: str, key: bytes, meta_key: str) -> int:
    """One note's sorted set and linkmeta hash into one links hash; returns the link ends."""
    r = ctx.redis
    pipe = r.pipeline(transaction=False)
    pipe.zrange(key, 0, -1, withscores=True)
    pipe.hgetall(meta_key)
    weights, metas = pipe.execute()
    packed = {nb: pack_link(float(w), _meta(metas.get(nb))) for nb, w in weights}
    with r.pipeline(transaction=True) as tx:
        changed(tx, ctx.keys, ns)
        tx.delete(key)
        tx.delete(meta_key)
        if packed:
            tx.hset(key, mapping=packed)
        tx.execute()
    return len(packed)


def _meta(raw: bytes | None) -> dict[str, Any]:
    meta = msgpack.unpackb(raw, raw=False) if raw else {}
    return meta if isinstance(meta, dict) else {}
