"""The periodic ``audit`` job: keep each namespace's audit stream bounded and erase what
``delete()`` asked to forget from it.

A delete erases the note's content at once: its hash keeps only id, status, times and
bookkeeping, and the delete's own audit entry names no content (worker/store/tombstone.py). Earlier
audit entries of the id (its create and updates) still hold its content, so the delete also
records the id in ``Keys.erased``; this job scans the audit stream and removes every entry of an
erased id that comes before its last delete entry (a note stored again under the same id after
its delete keeps its new history). Then it trims
the stream to ``audit_max`` entries and, with ``audit_max_age_s``, by age.

Bounded: the scan reads the stream in chunks of AUDIT_CHUNK, and the stream is trimmed on every
run, so one run reads at most about ``audit_max`` entries plus what came in since the last run.
"""

from __future__ import annotations

import time

from worker.context import WorkerContext

AUDIT_CHUNK = 1_000  #: audit entries read per round trip

#: KEYS: the erased set; ARGV: id, score, id, score, ... as read before the scan. Removes each
#: id whose score is unchanged: one deleted again during the scan stays for the next run.
FORGET_LUA = """
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return n
"""


def audit_namespace(ctx: WorkerContext, ns: str) -> int:
    """Erase the audit entries of ids deleted since the last run and trim the stream; return
    the entries removed."""
    return scrub(ctx, ns) + trim(ctx, ns)


def scrub(ctx: WorkerContext, ns: str) -> int:
    """Remove the audit entries of each erased id that come before its last delete entry in
    the stream (the delete's own entry stays, as does anything after it)."""
    keys = ctx.keys
    erased = {
        member.decode(): score
        for member, score in ctx.redis.zrange(keys.erased(ns), 0, -1, withscores=True)
    }
    if not erased:
        return 0
    earlier: dict[str, list[bytes]] = {nid: [] for nid in erased}
    doomed: list[bytes] = []
    low = "-"
    while True:
        rows = ctx.redis.xrange(keys.audit(ns), min=low, count=AUDIT_CHUNK)
        for entry_id, fields in rows:
            seen = earlier.get(fields.get(b"id", b"").decode(errors="replace"))
            if seen is None:
                continue
            if fields.get(b"op") == b"delete":
                doomed += seen
                seen.clear()
            else:
                seen.append(entry_id)
        if len(rows) < AUDIT_CHUNK:
            break
        low = "(" + rows[-1][0].decode()
    removed = 0
    for start in range(0, len(doomed), AUDIT_CHUNK):
        removed += int(ctx.redis.xdel(keys.audit(ns), *doomed[start : start + AUDIT_CHUNK]))
    done = [x for nid, score in erased.items() for x in (nid, str(int(score)))]
    ctx.redis.register_script(FORGET_LUA)(keys=[keys.erased(ns)], args=done)
    return removed


def trim(ctx: WorkerContext, ns: str) -> int:
    """Trim the audit stream to ``audit_max`` entries and ``audit_max_age_s``; the entries
    removed."""
    s, key = ctx.settings, ctx.keys.audit(ns)
    removed = 0
    if s.audit_max:
        removed += int(ctx.redis.xtrim(key, maxlen=s.audit_max, approximate=False))
    if s.audit_max_age_s:
        oldest_ms = int((time.time() - s.audit_max_age_s) * 1000)
        removed += int(ctx.redis.xtrim(key, minid=str(oldest_ms), approximate=False))
    return removed
