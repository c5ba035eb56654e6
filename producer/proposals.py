"""Review of evolution proposals (written by ``worker.organise.evolution``): decoding the records,
and the script that accepts, rejects or reverts one in a single atomic step.

A proposal hash holds the note's raw field values before (``b:<name>``) and after
(``a:<name>``) the change, for every evolved field plus ``version`` and ``updated_at``. The
review script (REVIEW_LUA) checks and writes in one EVALSHA:

- ``accept`` (pending -> applied) needs the note to hold exactly the ``b:`` values, i.e. to be
  unchanged since the proposal was made; it writes the ``a:`` values (version + 1).
- ``revert`` (applied -> reverted) needs the note to hold exactly the ``a:`` values, i.e. no
  write of any kind since the change was applied; it writes the ``b:`` values back, version and
  updated_at included, so the note hash is again what it was before the change.
- ``reject`` (pending -> rejected) changes no note.

The tags a rejected or reverted proposal added (its ``added`` field) join the note's entry in
``Keys.refused``, so evolution never proposes them for that note again.

Otherwise nothing is written and the caller gets ``Conflict``. The script also refuses (LOCKED)
while a worker holds the namespace lock, because a worker reads a note and writes it back under
that lock: a review slipped in between would be overwritten. Clients retry a busy review until
their reply timeout. Every step appends one audit entry in the same script.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from producer.errors import Conflict, InvalidInput, NotFound, ReplyTimeout
from producer.keys import Keys
from producer.protocol import PACKED_FIELDS, Proposal

STATUSES = ("pending", "applied", "rejected", "reverted")  #: a proposal's states
#: action -> (status it needs, status it leaves, audit op)
ACTIONS = {
    "accept": ("pending", "applied", "evolve-accept"),
    "reject": ("pending", "rejected", "evolve-reject"),
    "revert": ("applied", "reverted", "evolve-revert"),
}
BOOKKEEPING = ("version", "updated_at")  #: restored alongside the evolved fields
MAX_LIMIT = 1_000  #: most proposals one proposals() call returns
LOCKED_FIRST_WAIT_S = 0.002  #: first wait before a locked review is retried (doubling)
LOCKED_MAX_WAIT_S = 0.05  #: longest wait between retries

#: KEYS: lock, proposal, note, audit, proposed, proposals:<from>, proposals:<to>, refused.
#: ARGV: action, note id, now, actor, status needed, status left, audit op, packed audit
#: before, packed audit after, proposal id, audit source. Returns the proposal's HGETALL.
REVIEW_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('LOCKED a worker holds the namespace lock')
end
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return redis.error_reply('NOTFOUND no such proposal') end
if status ~= ARGV[5] or redis.call('HGET', KEYS[2], 'note') ~= ARGV[2] then
  return redis.error_reply('CONFLICT the proposal is ' .. status .. ', not ' .. ARGV[5])
end
if ARGV[1] ~= 'reject' then
  local have, want = 'b:', 'a:'
  if ARGV[1] == 'revert' then have, want = 'a:', 'b:' end
  if redis.call('HGET', KEYS[3], 'status') ~= 'active' then
    return redis.error_reply('CONFLICT the note is no longer active')
  end
  local names = {'version', 'updated_at'}
  for name in string.gmatch(redis.call('HGET', KEYS[2], 'fields'), '%S+') do
    names[#names + 1] = name
  end
  for _, name in ipairs(names) do
    if redis.call('HGET', KEYS[3], name) ~= redis.call('HGET', KEYS[2], have .. name) then
      return redis.error_reply('CONFLICT the note changed since (' .. name .. ')')
    end
  end
  if ARGV[1] == 'accept' then redis.call('HSET', KEYS[2], 'a:updated_at', ARGV[3]) end
  for _, name in ipairs(names) do
    local value = redis.call('HGET', KEYS[2], want .. name)
    if value then
      redis.call('HSET', KEYS[3], name, value)
    else
      redis.call('HDEL', KEYS[3], name)
    end
  end
  redis.call('INCR', KEYS[9])
end
local added = redis.call('HGET', KEYS[2], 'added')
if added and ARGV[1] ~= 'accept' then
  local old = redis.call('HGET', KEYS[8], ARGV[2])
  local refused = old and cmsgpack.unpack(old) or {}
  for _, tag in ipairs(cmsgpack.unpack(added)) do refused[#refused + 1] = tag end
  redis.call('HSET', KEYS[8], ARGV[2], cmsgpack.pack(refused))
end
redis.call('HSET', KEYS[2], 'status', ARGV[6], 'updated_at', ARGV[3])
if redis.call('HGET', KEYS[5], ARGV[2]) == ARGV[10] then redis.call('HDEL', KEYS[5], ARGV[2]) end
redis.call('ZREM', KEYS[6], ARGV[10])
redis.call('ZADD', KEYS[7], redis.call('HGET', KEYS[2], 'created_at'), ARGV[10])
redis.call('XADD', KEYS[4], '*', 'ts', ARGV[3], 'op', ARGV[7], 'id', ARGV[2], 'actor', ARGV[4],
  'source', ARGV[11], 'before', ARGV[8], 'after', ARGV[9])
return redis.call('HGETALL', KEYS[2])
"""


def decode_value(name: str, raw: bytes | None) -> Any:
    """A raw note-hash value as the Note model would read it (None when absent)."""
    if raw is None:
        return None
    if name in PACKED_FIELDS:
        return msgpack.unpackb(raw)
    if name == "version":
        return int(raw)
    return raw.decode()


def parse_proposal(ns: str, raw: Mapping[bytes, bytes]) -> Proposal:
    """Decode a proposal hash read with HGETALL."""
    f = {k.decode(): v for k, v in raw.items()}
    names = f["fields"].decode().split()
    return Proposal(
        id=f["id"].decode(),
        namespace=ns,
        note=f["note"].decode(),
        status=f["status"].decode(),  # type: ignore[arg-type]
        fields=names,
        before={n: decode_value(n, f.get(f"b:{n}")) for n in names},
        after={n: decode_value(n, f.get(f"a:{n}")) for n in names},
        source=f["source"].decode(),
        reason=f.get("reason", b"").decode(),
        triggers=msgpack.unpackb(f["triggers"]),
        batch=msgpack.unpackb(f["batch"]),
        created_at=float(f["created_at"]),
        updated_at=float(f["updated_at"]),
    )


def pairs(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A flat [field, value, ...] reply (HGETALL inside a script) as a mapping."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def newest(rows: Sequence[Sequence[tuple[bytes, float]]], limit: int) -> list[str]:
    """Proposal ids of several ZREVRANGE ... WITHSCORES replies, newest first, at most limit."""
    merged = sorted((row for reply in rows for row in reply), key=lambda r: (-r[1], r[0]))
    return [pid.decode() for pid, _ in merged[:limit]]


def review_call(
    keys: Keys,
    ns: str,
    action: str,
    raw: Mapping[bytes, bytes],
    actor: str,
    now: float,
) -> tuple[list[str], list[str | bytes]]:
    """KEYS and ARGV of REVIEW_LUA for ``action`` on the proposal read as ``raw``."""
    needed, left, op = ACTIONS[action]
    proposal = parse_proposal(ns, raw)
    pid, note = proposal.id, proposal.note
    before, after = _audit_values(raw, proposal, action)
    script_keys = [
        keys.lock(ns),
        keys.proposal(ns, pid),
        keys.note(ns, note),
        keys.audit(ns),
        keys.proposed(ns),
        keys.proposals(ns, needed),
        keys.proposals(ns, left),
        keys.refused(ns),
        keys.version(ns),
    ]
    args: list[str | bytes] = [
        action,
        note,
        repr(now),
        actor,
        needed,
        left,
        op,
        msgpack.packb(before, use_bin_type=True),
        msgpack.packb(after, use_bin_type=True),
        pid,
        f"{proposal.source} proposal:{pid}",
    ]
    return script_keys, args


def _audit_values(
    raw: Mapping[bytes, bytes], proposal: Proposal, action: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The audit entry's before/after: the fields and version a step changes, or the status."""
    if action == "reject":
        return {"status": "pending"}, {"status": "rejected"}
    old = {**proposal.before, "version": decode_value("version", raw.get(b"b:version"))}
    new = {**proposal.after, "version": decode_value("version", raw.get(b"a:version"))}
    return (old, new) if action == "accept" else (new, old)


def raise_review_error(exc: ResponseError) -> None:
    """Raise the error a failed review script stands for; return when it was LOCKED (the
    caller retries after ``next_wait``)."""
    text = str(exc)
    if text.startswith("LOCKED"):
        return
    if text.startswith("CONFLICT"):
        raise Conflict(text.removeprefix("CONFLICT ")) from exc
    if text.startswith("NOTFOUND"):
        raise NotFound(text.removeprefix("NOTFOUND ")) from exc
    raise exc


def next_wait(wait_s: float, deadline: float, ns: str) -> float:
    """The wait after ``wait_s`` before a locked review is retried; ReplyTimeout once the
    deadline (time.monotonic()) has passed."""
    if time.monotonic() + wait_s > deadline:
        raise ReplyTimeout(f"namespace {ns!r} stayed locked by a worker; retry the review")
    return min(wait_s * 2, LOCKED_MAX_WAIT_S)


def statuses(status: str | None) -> tuple[str, ...]:
    """The statuses a proposals() call lists."""
    if status is None:
        return STATUSES
    if status not in STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(STATUSES)}")
    return (status,)
