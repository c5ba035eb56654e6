"""Per-namespace job signatures: HMAC-SHA256 over the packed job, keyed by a namespace's secret.

A producer holds the keys of the namespaces it may use (``ZQ_NAMESPACE_KEYS``); a worker holds
every namespace's key and, with ``ZQ_REQUIRE_SIGNATURES=true``, refuses a job it cannot verify.
The signed bytes are the job's map without ``sig``, packed with its map keys sorted (at every
depth), so any msgpack implementation can reproduce them. A job naming several namespaces
carries one signature per namespace, in order, joined by ``.``; a namespace whose key the
producer lacks gets an empty part, which no worker accepts.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

SEPARATOR = "."  #: joins the per-namespace signatures of a multi-namespace job


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def signed_bytes(job: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the job without ``sig``, keys sorted, msgpack."""
    body = {k: v for k, v in job.items() if k != "sig"}
    return msgpack.packb(_canonical(body), use_bin_type=True)  # type: ignore[no-any-return]


def digest(secret: str, data: bytes) -> str:
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def sign(job: Mapping[str, Any], namespaces: Sequence[str], keys: Mapping[str, str]) -> str:
    """The ``sig`` of ``job`` for ``namespaces``: one HMAC per namespace whose key is held."""
    data = signed_bytes(job)
    return SEPARATOR.join(digest(keys[ns], data) if ns in keys else "" for ns in namespaces)


def unverified(
    job: Mapping[str, Any], namespaces: Sequence[str], keys: Mapping[str, str]
) -> list[str]:
    """The namespaces whose signature in ``job`` is missing or wrong (empty: all verified)."""
    sig = job.get("sig")
    parts = sig.split(SEPARATOR) if isinstance(sig, str) else []
    if len(parts) != len(namespaces):
        return list(namespaces)
    data = signed_bytes(job)
    return [
        ns
        for ns, part in zip(namespaces, parts, strict=True)
        if ns not in keys or not hmac.compare_digest(part, digest(keys[ns], data))
    ]
