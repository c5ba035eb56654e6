"""Redis server settings that zettelq's speed depends on, checked when a worker starts.

Nothing breaks without them; a worker logs what it found so an operator running their own Redis
learns why it costs more than the benchmarks say.
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
        for name in LISTPACK_VALUE_NAMES:
            found = r.config_get(name)
            if name in found:
                value = int(found[name])
                break
        else:
            return []
    except RedisError:
        return []
    if value >= LISTPACK_VALUE:
        return []
    return [
        f"Redis has {name} {value}: links hashes will use the hashtable encoding, which costs "
        f"~25% more Redis CPU per organised note and ~12% more memory; set it to "
        f"{LISTPACK_VALUE} (deploy/redis.conf)"
    ]
