"""Redis URLs zettelq reads beyond redis-py's own: a Redis Cluster as
``redis+cluster://[user:password@]host:port[,host:port...]`` (``rediss+cluster://`` for TLS),
and a Redis watched by Sentinel as
``redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]``
(``rediss+sentinel://`` for TLS): the hosts are the sentinels, the user and password those of
the master. Pure: parsing only (producer/connection.py builds the clients)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from producer.errors import InvalidSetting

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  #: scheme -> TLS
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  #: scheme -> TLS
#: kind of URL -> how it lists its hosts, for the error of a malformed one
EXAMPLES = {
    "cluster": "nodes as host:port[,host:port...] (redis+cluster://10.0.0.1:7000,10.0.0.2:7000)",
    "sentinel": "sentinels as host:port[,host:port...]"
    " (redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster)",
}


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names a master through its sentinels (``redis+sentinel://``,
    ``rediss+sentinel://``)."""
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def cluster_options(url: str) -> dict[str, Any]:
    """RedisCluster's arguments for a cluster URL: startup nodes (as (host, port)), user,
    password and TLS. InvalidSetting names ZQ_REDIS_URL when the URL is malformed."""
    tls, userinfo, hostlist, path = _parts(url, CLUSTER_SCHEMES, "cluster", "ZQ_REDIS_URL")
    if path not in ("", "0"):
        raise InvalidSetting(f"ZQ_REDIS_URL: a Redis Cluster has only database 0, got /{path}")
    nodes = [_node(part, "cluster") for part in hostlist.split(",")]
    return {"startup_nodes": nodes, "ssl": tls, **_credentials(userinfo)}


def sentinel_options(url: str, variable: str = "ZQ_REDIS_URL") -> dict[str, Any]:
    """What a Sentinel URL names: ``sentinels`` (as (host, port)), ``service_name``, ``db``,
    and the master's ``username``, ``password`` and ``ssl``. InvalidSetting names ``variable``
    when the URL is malformed."""
    tls, userinfo, hostlist, path = _parts(url, SENTINEL_SCHEMES, "sentinel", variable)
    service, _, db = path.partition("/")
    if not service or "/" in db or not (db == "" or db.isdigit()):
        raise InvalidSetting(
            f"{variable}: a sentinel URL ends in /service_name[/db]"
            f" (redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster/0), got /{path}"
        )
    sentinels = [_node(part, "sentinel", variable) for part in hostlist.split(",")]
    return {
        "sentinels": sentinels,
        "service_name": unquote(service),
        "db": int(db or 0),
        "ssl": tls,
        **_credentials(userinfo),
    }


def _parts(
    url: str, schemes: dict[str, bool], kind: str, variable: str
) -> tuple[bool, str, str, str]:
    """(TLS, user info, host list, path) of a ``kind`` URL; it may carry no query options."""
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    if query:
        raise InvalidSetting(f"{variable}: a {kind} URL takes no query options, got ?{query}")
    userinfo, _, hostlist = rest.rpartition("@")
    hostlist, _, path = hostlist.partition("/")
    return schemes[scheme.lower()], userinfo, hostlist, path


def _credentials(userinfo: str) -> dict[str, str]:
    user, _, password = userinfo.partition(":")
    found = {}
    if user:
        found["username"] = unquote(user)
    if password:
        found["password"] = unquote(password)
    return found


def _node(part: str, kind: str, variable: str = "ZQ_REDIS_URL") -> tuple[str, int]:
    host, _, port = part.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSetting(f"{variable}: a {kind} URL lists {EXAMPLES[kind]}, got {part!r}")
    return host, int(port)
