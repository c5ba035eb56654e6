"""Every Redis key zettelq uses. ``P`` is ``settings.key_prefix`` (default ``zq``).

Keys of one namespace share the hash tag ``{ns}`` so a namespace lives on one Redis Cluster slot
and its multi-key updates stay atomic. Shard keys carry the tag ``{s<N>}``.

=============================  ======  ==========================================================
key                            type    contents
=============================  ======  ==========================================================
P:{sN}:inbox                   stream  packed jobs (store/delete/restore, field ``j``) for the
                                       namespaces of shard N; consumer group ``zq``; entries
                                       deleted once committed; a job re-queued by ``zettelq dead
                                       retry`` also has ``o``, the entry id it was first queued
                                       under
P:{sN}:lease                   string  token of the worker draining shard N (PX lease_ms)
P:{sN}:kicked                  string  set while a drain task for shard N is queued
P:{sN}:drainer                 string  the worker process that last drained shard N
P:{sN}:search                  list    packed SearchJob requests over one namespace of shard N,
                                       served by the process that drains the shard (see
                                       worker/search/routing.py)
P:search                       list    packed SearchJob requests over several namespaces,
                                       served by every search thread
P:searcher:<consumer>          string  set while that worker process serves searches (PX)
P:process:<consumer>           hash    heartbeat of a live worker, searcher or beat process:
                                       role, host, pid, started, beat, state, version (PX; see
                                       worker/runtime/heartbeat.py); deleted when it stops cleanly
P:processes                    zset    consumer -> when its process hash expires (epoch ms):
                                       the index `zettelq health` reads instead of a SCAN
P:reply:<job_id>               list    one packed Reply, EXPIRE result_ttl_s; the caller BLPOPs it
P:dead                         stream  dead-lettered jobs: raw payload, reason, source, time
P:namespaces                   set     every namespace ever written
P:langgraph:namespaces         set     every namespace a LangGraph ZettelqStore put an item into
                                       (producer/adapters/langgraph/); list_namespaces reads it
P:organise                     list    packed OrganiseJob requests, served by every worker process
P:runs                         hash    periodic job name -> JSON of its last beat run (when, how
                                       long, namespaces visited and carried over, work done)
P:redbeat:*                    (beat)  celery-redbeat's schedule and leader lock, in the broker
P:vcache:<embedder>:<sha256>   string  float32 vector of the text with that SHA-256 (hex) by
                                       that embedder; EX vector_cache_ttl_s
P:token:<token_id>             hash    one HTTP/MCP bearer token: sha256 (hex) of its secret,
                                       label, read and write (JSON lists of namespaces, ``*`` =
                                       any), created_at (see producer/adapters/tokens.py)
P:tokens                       set     every token id, for `zettelq token list`
P:tokens:changed               channel pub/sub: the id of each token revoked; every HTTP or MCP
                                       door drops its cached grant (producer/adapters/
                                       revocation.py)
P:{ns}:note:<id>               hash    one note (fields: see producer.protocol.NOTE_FIELDS; ``src``:
                                       the inbox entry of the last store or delete applied); a
                                       deleted id never stored holds only id, status, src
P:{ns}:links:<id>              hash    neighbour id -> packed link (producer.protocol.pack_link):
                                       weight, relation label, then msgpack {reason, source,
                                       at}; one hash per end (the ends' metadata can differ)
P:{ns}:active                  zset    active note id -> seq (the FAISS int64 id)
P:{ns}:seq                     string  last seq handed out (INCR)
P:{ns}:tombstoned              zset    tombstoned note id -> time of tombstoning
P:{ns}:changes                 stream  change log the projections replay: {op: add|remove, seq}
P:{ns}:version                 string  INCR'd by every transaction that changes what a search
                                       reads of the namespace's notes (their fields, links, the
                                       notes themselves; not access times): search processes
                                       keep what they read while it holds (worker/index/rows.py)
P:{ns}:touches                 string  INCR'd by each search that reinforces hits of the
                                       namespace, with its reply (worker/index/rows.py)
P:{ns}:audit                   stream  one entry per mutation: who/what/when/before/after/source
P:{ns}:stats                   hash    counters and last organisation times; run_<job>,
                                       work_<job>, took_<job>: the last run of each periodic job;
                                       the seq cursors of the pairwise jobs (supersede_seq,
                                       merge_seq)
P:{ns}:tail                    string  packed (id, event_time, agent, created_at) of the last new
                                       note, for the next batch's sequence links
P:{ns}:lock                    string  token of the worker mutating the namespace (PX lock_ms)
P:{ns}:llm_budget:<hour>       string  LLM calls made for the namespace in that hour (epoch hours;
                                       INCR, EXPIRE 2 h); capped at llm_budget_per_hour
P:{ns}:clusters                hash    insight id -> packed sorted ids of the cluster of notes it
                                       abstracts (consolidation)
P:{ns}:proposal:<id>           hash    one evolution proposal: note, status, source, reason,
                                       fields, triggers, batch, times, and ``b:<field>`` /
                                       ``a:<field>`` the note's raw values before / after
                                       (evolved fields, version, updated_at)
P:{ns}:proposals:<status>      zset    proposal id -> creation time, one set per status
                                       (pending | applied | rejected | reverted)
P:{ns}:proposed                hash    note id -> its pending proposal id (at most one per note)
P:{ns}:evolved                 string  id of the last audit entry evolution has read
P:{ns}:refused                 hash    note id -> packed tags a reviewer rejected or reverted
                                       for it; evolution never proposes them again
P:{ns}:judge                   list    packed {id, src, candidates} of notes waiting for the LLM
                                       link judge (ZQ_JUDGE=llm), oldest first
=============================  ======  ==========================================================

On a Redis Cluster (``Keys(..., cluster=True)``, ZQ_REDIS_URL=redis+cluster://...) the search
lists share one hash tag instead, so that a search thread can BRPOP its shards' lists and the
shared one in one call: ``P:{search}:sN`` is shard N's and ``P:{search}`` the shared one. Every
other key is named as above; every multi-key script and transaction stays within one
namespace's or one shard's tag.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from producer.settings import ProducerSettings


class Keys:
    """Key names under one prefix. Pure: no I/O."""

    def __init__(self, prefix: str = "zq", shard_count: int = 8, *, cluster: bool = False) -> None:
        self.prefix = prefix
        self.shard_count = shard_count
        #: the data store is a Redis Cluster: the search lists share one slot
        self.cluster = cluster

    @classmethod
    def of(cls, settings: ProducerSettings) -> Keys:
        """The keys ``settings`` name: their prefix, shard count and kind of data store."""
        return cls(settings.key_prefix, settings.shard_count, cluster=settings.redis_cluster)

    def shard_of(self, namespace: str) -> int:
        """The shard a namespace's writes go to: crc32 of its name modulo the shard count."""
        return zlib.crc32(namespace.encode()) % self.shard_count

    # shard keys
    def inbox(self, shard: int) -> str:
        return f"{self.prefix}:{{s{shard}}}:inbox"

    def lease(self, shard: int) -> str:
        return f"{self.prefix}:{{s{shard}}}:lease"

    def kicked(self, shard: int) -> str:
        return f"{self.prefix}:{{s{shard}}}:kicked"

    def drainer(self, shard: int) -> str:
        return f"{self.prefix}:{{s{shard}}}:drainer"

    def shard_search(self, shard: int) -> str:
        if self.cluster:
            return f"{self.prefix}:{{search}}:s{shard}"
        return f"{self.prefix}:{{s{shard}}}:search"

    def shard_counters(self, shard: int) -> str:
        """Hash of the shard's running totals: ``jobs`` (inbox entries organised, by drains)."""
        return f"{self.prefix}:{{s{shard}}}:counters"

    # global keys
    def search_queue(self) -> str:
        if self.cluster:
            return f"{self.prefix}:{{search}}"
        return f"{self.prefix}:search"

    def search_queue_of(self, namespaces: list[str]) -> str:
        """Where a search over ``namespaces`` is queued: the shard's list for one namespace,
        so the worker that drains it answers; the shared list for several."""
        if len(namespaces) == 1:
            return self.shard_search(self.shard_of(namespaces[0]))
        return self.search_queue()

    def searcher(self, consumer: str) -> str:
        return f"{self.prefix}:searcher:{consumer}"

    def searchers(self) -> str:
        """Sorted set: search servers' consumers -> when their stats lapse (epoch ms)."""
        return f"{self.prefix}:searchers"

    def search_stats(self, consumer: str) -> str:
        """Hash of a search server's last minute (searches, p50_ms, p99_ms), renewed with its
        searcher key (worker/search/routing.py) and lapsing with it."""
        return f"{self.prefix}:searchstats:{consumer}"

    def process(self, consumer: str) -> str:
        return f"{self.prefix}:process:{consumer}"

    def processes(self) -> str:
        return f"{self.prefix}:processes"

    def reply(self, job_id: str) -> str:
        return f"{self.prefix}:reply:{job_id}"

    def dead(self) -> str:
        return f"{self.prefix}:dead"

    def namespaces(self) -> str:
        return f"{self.prefix}:namespaces"

    def langgraph_namespaces(self) -> str:
        return f"{self.prefix}:langgraph:namespaces"

    def organise_queue(self) -> str:
        return f"{self.prefix}:organise"

    def runs(self) -> str:
        return f"{self.prefix}:runs"

    def redbeat(self) -> str:
        """Prefix of celery-redbeat's keys (in the broker Redis)."""
        return f"{self.prefix}:redbeat:"

    def vcache(self, embedder: str, sha256: str) -> str:
        return f"{self.prefix}:vcache:{embedder}:{sha256}"

    def token(self, token_id: str) -> str:
        return f"{self.prefix}:token:{token_id}"

    def tokens(self) -> str:
        return f"{self.prefix}:tokens"

    def tokens_changed(self) -> str:
        """The pub/sub channel of revoked token ids (not a key)."""
        return f"{self.prefix}:tokens:changed"

    # namespace keys
    def note(self, ns: str, note_id: str) -> str:
        return f"{self.prefix}:{{{ns}}}:note:{note_id}"

    def links(self, ns: str, note_id: str) -> str:
        return f"{self.prefix}:{{{ns}}}:links:{note_id}"

    def active(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:active"

    def seq(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:seq"

    def tombstoned(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:tombstoned"

    def erased(self, ns: str) -> str:
        """Sorted set: ids deleted (their content erased) -> when, in ms, until the audit job
        has removed their earlier audit entries (worker/organise/audit.py)."""
        return f"{self.prefix}:{{{ns}}}:erased"

    def changes(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:changes"

    def version(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:version"

    def touches(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:touches"

    def audit(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:audit"

    def stats(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:stats"

    def tail(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:tail"

    def lock(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:lock"

    def llm_budget(self, ns: str, hour: int) -> str:
        return f"{self.prefix}:{{{ns}}}:llm_budget:{hour}"

    def clusters(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:clusters"

    def proposal(self, ns: str, proposal_id: str) -> str:
        return f"{self.prefix}:{{{ns}}}:proposal:{proposal_id}"

    def proposals(self, ns: str, status: str) -> str:
        return f"{self.prefix}:{{{ns}}}:proposals:{status}"

    def proposed(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:proposed"

    def evolved(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:evolved"

    def refused(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:refused"

    def judge(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:judge"
