"""Redis URLs zettelq reads beyond redis-py's own: a Redis Cluster as
``redis+cluster://[user:password@]host:port[,host:port...]`` (``rediss+cluster://`` for TLS).
Pure: parsing only (producer/connection.py builds the clients)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from producer.errors import InvalidSetting

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  #: scheme -> TLS


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def cluster_options(url: str) -> dict[str, Any]:
    """RedisCluster's arguments for a cluster URL: startup nodes (as (host, port)), user,
    password and TLS. InvalidSetting names ZQ_REDIS_URL when the URL is malformed."""
    scheme, _, rest = url.partition("://")
    tls = CLUSTER_SCHEMES[scheme.lower()]
    rest, _, query = rest.partition("?")
    if query:
        raise InvalidSetting(f"ZQ_REDIS_URL: a cluster URL takes no query options, got ?{query}")
    userinfo, _, hostlist = rest.rpartition("@")
    hostlist, _, path = hostlist.partition("/")
    if path not in ("", "0"):
        raise InvalidSetting(f"ZQ_REDIS_URL: a Redis Cluster has only database 0, got /{path}")
    nodes = [_node(part) for part in hostlist.split(",")]
    user, _, password = userinfo.partition(":")
    options: dict[str, Any] = {"startup_nodes": nodes, "ssl": tls}
    if user:
        options["username"] = unquote(user)
    if password:
        options["password"] = unquote(password)
    return options


def _node(part: str) -> tuple[str, int]:
    host, _, port = part.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSetting(
            "ZQ_REDIS_URL: a cluster URL lists nodes as host:port[,host:port...]"
            f" (redis+cluster://10.0.0.1:7000,10.0.0.2:7000), got {part!r}"
        )
    return host, int(port)
