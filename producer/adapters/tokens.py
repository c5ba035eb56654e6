"""Bearer tokens for the network doors (HTTP API, MCP over HTTP): each maps to the namespaces it
may read and those it may write.

A secret looks like ``zq_<token id>_<43 random characters>``. Only its SHA-256 is kept, in the
hash ``P:token:<token id>`` (fields ``sha256``, ``label``, ``read``, ``write``, ``created_at``);
``P:tokens`` is the set of every token id. The secret is shown once, by ``create``, and cannot be
recovered. Namespace grants are exact names, or ``*`` for any namespace.

Whatever is read back from Redis is untrusted: a record that does not parse (or whose hash does
not match) authenticates nobody and is skipped by ``list``. A door refuses a request with
``Unauthenticated`` (no valid token: HTTP 401) or ``Forbidden`` (the grant lacks the namespace:
HTTP 403).

A door keeps the grants it has verified in a GrantCache (ZQ_TOKEN_CACHE_S), so a known token
costs no Redis round trip; the secret's digest is still compared on every request. ``revoke``
PUBLISHes the token id on ``P:tokens:changed`` in the transaction that deletes the token, and
each door drops the id's grant when the message arrives (producer/adapters/revocation.py runs
that subscription and says when the cache is bypassed).
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from redis import asyncio as aioredis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from producer import validation as v
from producer.connection import data_redis
from producer.core import redis_errors
from producer.errors import InvalidInput, ProtocolError, ZettelqError
from producer.keys import Keys
from producer.settings import ProducerSettings

log = logging.getLogger(__name__)

ANY = "*"  #: a grant of every namespace
MAX_LABEL_CHARS = 200  #: longest token label
MAX_GRANTS = 256  #: most namespaces one token may name for reading, and for writing
SECRET_RE = re.compile(r"zq_([0-9a-f]{16})_[A-Za-z0-9_-]{43}")  #: the shape of a secret
TOKEN_ID_RE = re.compile(r"[0-9a-f]{16}")  #: the shape of a token id
FIELDS = ("sha256", "label", "read", "write", "created_at")  #: fields of a token hash


class Unauthenticated(ZettelqError):
    """No bearer token, or one that is unknown, revoked or malformed."""

    def __init__(self, message: str | None = None, invalid_token: bool = False) -> None:
        super().__init__(message)
        #: the WWW-Authenticate challenge of an HTTP 401 (RFC 6750)
        self.challenge = 'Bearer realm="zettelq"' + (', error="invalid_token"' * invalid_token)


class Forbidden(ZettelqError, PermissionError):
    """The token does not grant this namespace for this use (read or write)."""


class Grant(BaseModel):
    """What one token may do: read and write these namespaces (``*`` = any)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token_id: str
    label: str
    read: frozenset[str]
    write: frozenset[str]
    created_at: float

    @field_validator("read", "write", mode="after")
    @classmethod
    def _namespaces(cls, names: frozenset[str]) -> frozenset[str]:
        return frozenset(check_grants(names, "namespace grants"))

    def can_read(self, ns: str) -> bool:
        return ANY in self.read or ns in self.read

    def can_write(self, ns: str) -> bool:
        return ANY in self.write or ns in self.write


def check_grants(names: object, what: str) -> list[str]:
    """``names`` as a sorted list of distinct namespaces or ``*``; InvalidInput otherwise."""
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise InvalidInput(f"{what} must be a list of namespaces (or {ANY!r}), got {names!r:.80}")
    out = sorted({name if name == ANY else v.check_namespace(name) for name in names})
    if len(out) > MAX_GRANTS:
        raise InvalidInput(f"{what} name {len(out)} namespaces; the limit is {MAX_GRANTS}")
    return out


def check_label(label: object) -> str:
    if not isinstance(label, str) or len(label) > MAX_LABEL_CHARS:
        raise InvalidInput(f"label must be a str of at most {MAX_LABEL_CHARS} characters")
    if label and not label.isprintable():
        raise InvalidInput("label must be printable text (no control characters)")
    return label


def digest(secret: str) -> str:
    """SHA-256 (hex) of a secret: what is stored in its place."""
    return hashlib.sha256(secret.encode()).hexdigest()


def token_id_of(secret: object) -> str | None:
    """The token id a well-formed secret carries, else None."""
    if not isinstance(secret, str):
        return None
    found = SECRET_RE.fullmatch(secret)
    return found.group(1) if found else None


def parse_grant(token_id: str, raw: Mapping[bytes, bytes]) -> Grant | None:
    """The Grant of a token hash read from Redis, or None when it does not parse."""
    try:
        fields = {name: raw[name.encode()].decode() for name in FIELDS}
        created_at = float(fields["created_at"])
        if not math.isfinite(created_at):
            return None
        return Grant(
            token_id=token_id,
            label=check_label(fields["label"]),
            read=_stored_grants(fields["read"]),
            write=_stored_grants(fields["write"]),
            created_at=created_at,
        )
    except (KeyError, UnicodeDecodeError, ValueError, TypeError, ValidationError):
        log.warning("token record is malformed token_id=%s", token_id)
        return None


def _stored_grants(text: str) -> frozenset[str]:
    names = json.loads(text)
    if not isinstance(names, list):
        raise ValueError("stored grants are not a JSON list")
    return frozenset(check_grants(names, "stored grants"))


def raise_unless_wrong_type(exc: ResponseError) -> None:
    """Re-raise ``exc`` unless a key held another type than expected (WRONGTYPE): a token key
    that is not a hash is not a token."""
    if not str(exc).startswith("WRONGTYPE"):
        raise exc
    log.warning("a token key holds another type: %s", exc)


def verify(secret: str, token_id: str, raw: Mapping[bytes, bytes]) -> Grant | None:
    """The Grant when ``raw`` (the token's hash) holds the digest of ``secret``, else None."""
    stored = raw.get(b"sha256", b"")
    if not hmac.compare_digest(stored, digest(secret).encode()):
        return None
    return parse_grant(token_id, raw)


@dataclass(frozen=True, slots=True)
class CachedGrant:
    """A grant verified from Redis, the digest its record held, and when it stops being served."""

    grant: Grant
    sha256: bytes
    expires_at: float

    def admit(self, secret: str) -> Grant | None:
        """The grant when ``secret`` hashes to the cached digest (compared in constant time)."""
        return self.grant if hmac.compare_digest(self.sha256, digest(secret).encode()) else None


class GrantCache:
    """Verified grants by token id, in one door process. It serves only while it is live (its
    subscription to revocations is confirmed; producer/adapters/revocation.py starts and stops
    it), each grant for at most ``max_age_s``, and a read of Redis fills it only if no drop,
    start or stop came between the read's ``ticket`` and its ``put`` (the record read may be the
    one just revoked). Policy only: the caller reads Redis."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._grants: dict[str, CachedGrant] = {}
        self._live = False
        self._epoch = 0  # moves on every drop, start and stop

    @property
    def live(self) -> bool:
        return self._live

    def get(self, token_id: str) -> CachedGrant | None:
        """The cached grant of ``token_id`` while it is fresh and the cache live, else None."""
        cached = self._grants.get(token_id) if self._live else None
        if cached is not None and self._clock() >= cached.expires_at:
            del self._grants[token_id]
            return None
        return cached

    def ticket(self) -> int | None:
        """Taken before a read of Redis and handed to ``put`` after it; None while not live."""
        return self._epoch if self._live else None

    def put(self, ticket: int | None, grant: Grant, sha256: bytes) -> None:
        """Keep ``grant`` unless the cache was dropped from, started or stopped since ``ticket``."""
        if ticket is not None and ticket == self._epoch:
            expires_at = self._clock() + self.max_age_s
            self._grants[grant.token_id] = CachedGrant(grant, sha256, expires_at)

    def drop(self, token_id: str) -> None:
        """Forget the grant of ``token_id`` (revoked), and any read under way."""
        self._epoch += 1
        self._grants.pop(token_id, None)

    def start(self) -> None:
        """The subscription is confirmed: serve from now on, starting empty."""
        self._reset(live=True)

    def stop(self) -> None:
        """The subscription is gone: serve nothing (every check reads Redis) until ``start``."""
        self._reset(live=False)

    def _reset(self, live: bool) -> None:
        self._epoch += 1
        self._grants.clear()
        self._live = live


class TokenStore:
    """Creates, lists, revokes and checks tokens in Redis under one key prefix."""

    def __init__(self, redis: redis.Redis | RedisCluster, key_prefix: str) -> None:
        self._redis = redis
        self.keys = Keys(key_prefix)

    @classmethod
    def from_settings(cls, settings: ProducerSettings) -> TokenStore:
        client = data_redis(settings, socket_timeout=settings.socket_timeout_s)
        return cls(client, settings.key_prefix)

    def close(self) -> None:
        """Close the Redis client (also one passed in)."""
        self._redis.close()

    def __enter__(self) -> TokenStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(
        self, *, read: Iterable[str] = (), write: Iterable[str] = (), label: str = ""
    ) -> tuple[str, Grant]:
        """A new token: its secret (shown once, never stored) and its grant."""
        readable = check_grants(read, "read")
        writable = check_grants(write, "write")
        if not readable and not writable:
            raise InvalidInput("a token needs at least one namespace to read or write")
        token_id = secrets.token_hex(8)
        secret = f"zq_{token_id}_{secrets.token_urlsafe(32)}"
        grant = Grant(
            token_id=token_id,
            label=check_label(label),
            read=frozenset(readable),
            write=frozenset(writable),
            created_at=time.time(),
        )
        record = {
            "sha256": digest(secret),
            "label": grant.label,
            "read": json.dumps(readable),
            "write": json.dumps(writable),
            "created_at": repr(grant.created_at),
        }
        with redis_errors():
            if isinstance(self._redis, RedisCluster):  # two slots: the index entry second
                self._redis.hset(self.keys.token(token_id), mapping=record)
                self._redis.sadd(self.keys.tokens(), token_id)
                return secret, grant
            pipe = self._redis.pipeline(transaction=True)
            pipe.hset(self.keys.token(token_id), mapping=record)
            pipe.sadd(self.keys.tokens(), token_id)
            pipe.execute()
        return secret, grant

    def revoke(self, token_id: str) -> bool:
        """Delete a token and tell the doors (PUBLISH on ``P:tokens:changed``); False when no
        token has that id."""
        if not isinstance(token_id, str) or not TOKEN_ID_RE.fullmatch(token_id):
            return False
        with redis_errors():
            if isinstance(self._redis, RedisCluster):  # two slots: the token itself first
                # and no PUBLISH: no door caches grants on a cluster (see revocation.py)
                deleted = self._redis.delete(self.keys.token(token_id))
                removed = self._redis.srem(self.keys.tokens(), token_id)
                return bool(deleted or removed)
            pipe = self._redis.pipeline(transaction=True)
            pipe.delete(self.keys.token(token_id))
            pipe.srem(self.keys.tokens(), token_id)
            pipe.publish(self.keys.tokens_changed(), token_id)
            deleted, removed, _ = pipe.execute()
        return bool(deleted or removed)

    def list(self) -> builtins.list[Grant]:
        """Every token's grant, oldest first (malformed records are skipped)."""
        with redis_errors():
            try:
                members = self._redis.smembers(self.keys.tokens())
            except ResponseError as exc:
                raise_unless_wrong_type(exc)
                raise ProtocolError(f"{self.keys.tokens()} is not a set") from exc
            ids = sorted(m.decode(errors="replace") for m in members)
            ids = [i for i in ids if TOKEN_ID_RE.fullmatch(i)]
            pipe = self._redis.pipeline(transaction=False)
            for token_id in ids:
                pipe.hgetall(self.keys.token(token_id))
            rows: builtins.list[Any] = pipe.execute(raise_on_error=False)
        grants = [
            parse_grant(i, raw)
            for i, raw in zip(ids, rows, strict=True)
            if raw and not isinstance(raw, ResponseError)
        ]
        return sorted((g for g in grants if g is not None), key=lambda g: g.created_at)

    def check(self, secret: str) -> Grant | None:
        """The grant of this secret; None for an unknown, revoked or malformed one."""
        token_id = token_id_of(secret)
        if token_id is None:
            return None
        with redis_errors():
            try:
                raw = self._redis.hgetall(self.keys.token(token_id))
            except ResponseError as exc:
                raise_unless_wrong_type(exc)
                return None
        return verify(secret, token_id, raw) if raw else None


class AsyncTokenStore:
    """``TokenStore.check`` for asyncio servers, on an asyncio Redis client, with the grants
    ``cache`` gives and keeps (when there is one, see GrantCache)."""

    def __init__(
        self, redis: aioredis.Redis, key_prefix: str, cache: GrantCache | None = None
    ) -> None:
        self._redis = redis
        self.keys = Keys(key_prefix)
        self.cache = cache

    async def check(self, secret: str) -> Grant | None:
        token_id = token_id_of(secret)
        if token_id is None:
            return None
        cached = self.cache.get(token_id) if self.cache else None
        if cached is not None:
            return cached.admit(secret)
        ticket = self.cache.ticket() if self.cache else None
        with redis_errors():
            try:
                raw = await self._redis.hgetall(self.keys.token(token_id))
            except ResponseError as exc:
                raise_unless_wrong_type(exc)
                return None
        grant = verify(secret, token_id, raw) if raw else None
        if grant is not None and self.cache is not None:
            self.cache.put(ticket, grant, raw[b"sha256"])
        return grant
