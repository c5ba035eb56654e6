"""Redis server settings that zettelq's durability and speed depend on, checked when a worker
starts.

Nothing breaks without them; a worker logs a warning for each, so an operator running their own
Redis learns that it can lose notes (no AOF) or costs more than the benchmarks say.
"""

from __future__ import annotations

from redis import Redis
from redis.exceptions import RedisError

#: A packed link (weight, reason, label, source, time) is ~130 bytes; a links hash keeps the
#: compact listpack encoding only while every value fits under the server's bound.
LISTPACK_VALUE = 256
#: The bound's name since Redis 7, then its name before (7.x answers to both).
LISTPACK_VALUE_NAMES = ("hash-max-listpack-value", "hash-max-ziplist-value")


def advice(r: Redis) -> list[str]:
    """What to change in the server's configuration (empty when nothing, or when CONFIG GET is
    not allowed to this user)."""
    try:
        found = {name: r.config_get(name) for name in ("appendonly", *LISTPACK_VALUE_NAMES)}
    except RedisError:
        return []
    out = []
    if found["appendonly"].get("appendonly") == "no":
        out.append(
            "Redis has appendonly no: it holds the only copy of the notes, and a crash or "
            "restart loses every write since its last snapshot; turn AOF on (deploy/redis.conf)"
        )
    name = next((n for n in LISTPACK_VALUE_NAMES if n in found[n]), None)
    if name is not None and int(found[name][name]) < LISTPACK_VALUE:
        out.append(
            f"Redis has {name} {found[name][name]}: links hashes will use the hashtable "
            f"encoding, which costs ~25% more Redis CPU per organised note and ~12% more "
            f"memory; set it to {LISTPACK_VALUE} (deploy/redis.conf)"
        )
    return out
