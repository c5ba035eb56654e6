"""The dead-letter stream: jobs a worker could not decode or apply, with their reasons."""

from __future__ import annotations

from typing import Any, Protocol

from redis import Redis

from producer.keys import Keys

#: field of an inbox entry re-queued from the dead-letter stream: the entry id the job had when
#: first queued, by which the worker judges its place in stream order
ORIGIN_FIELD = "o"


class Streams(Protocol):
    """What these functions use of a WorkerContext (the CLI passes a lighter one)."""

    @property
    def redis(self) -> Redis: ...

    @property
    def keys(self) -> Keys: ...


def list_dead(ctx: Streams, count: int = 20) -> list[dict[str, Any]]:
    """The oldest ``count`` dead-lettered jobs (payload shown as its size and first bytes)."""
    rows = []
    for entry_id, fields in ctx.redis.xrange(ctx.keys.dead(), count=count):
        payload = fields.get(b"payload", b"")
        rows.append(
            {
                "dead_id": entry_id.decode(),
                "reason": fields.get(b"reason", b"").decode(errors="replace"),
                "namespace": fields.get(b"ns", b"").decode(errors="replace"),
                "shard": int(fields.get(b"shard", b"0")),
                "entry": fields.get(b"entry", b"").decode(),
                "at": float(fields.get(b"ts", b"0")),
                "payload_bytes": len(payload),
                "payload_head": payload[:64].hex(),
            }
        )
    return rows


def retry_dead(ctx: Streams, count: int = 20) -> int:
    """Put the oldest ``count`` dead jobs back on their shard streams (e.g. after a fix), each
    with its original entry id: it is applied only if no later job of its id has been."""
    moved = 0
    for entry_id, fields in ctx.redis.xrange(ctx.keys.dead(), count=count):
        shard = int(fields.get(b"shard", b"0")) % ctx.keys.shard_count
        requeued = {"j": fields.get(b"payload", b"")}
        if fields.get(b"entry"):
            requeued[ORIGIN_FIELD] = fields[b"entry"]
        pipe = ctx.redis.pipeline(transaction=False)
        pipe.xadd(ctx.keys.inbox(shard), requeued)
        pipe.xdel(ctx.keys.dead(), entry_id)
        pipe.execute()
        moved += 1
    return moved


def purge_dead(ctx: Streams) -> int:
    """Drop every dead-lettered job; return how many there were."""
    pipe = ctx.redis.pipeline(transaction=True)
    pipe.xlen(ctx.keys.dead())
    pipe.delete(ctx.keys.dead())
    return int(pipe.execute()[0])
