"""Every Redis key zettelq uses. ``P`` is ``settings.key_prefix`` (default ``zq``).

Keys of one namespace share the hash tag ``{ns}`` so a namespace lives on one Redis Cluster slot
and its multi-key updates stay atomic. Shard keys carry the tag ``{s<N>}``.

=============================  ======  ==========================================================
key                            type    contents
=============================  ======  ==========================================================
P:{sN}:inbox                   stream  packed jobs (store/delete) for the namespaces of shard N;
                                       consumer group ``zq``; entries deleted once committed
P:{sN}:lease                   string  token of the worker draining shard N (PX lease_ms)
P:{sN}:kicked                  string  set while a drain task for shard N is queued
P:search                       list    packed SearchJob requests, served by every worker process
P:reply:<job_id>               list    one packed Reply, EXPIRE result_ttl_s; the caller BLPOPs it
P:dead                         stream  dead-lettered jobs: raw payload, reason, source, time
P:namespaces                   set     every namespace ever written
P:vcache:<embedder>:<sha256>   string  float32 vector of the text with that SHA-256 (hex) by
                                       that embedder; EX vector_cache_ttl_s
P:{ns}:note:<id>               hash    one note (fields: see producer.protocol.NOTE_FIELDS)
P:{ns}:links:<id>              zset    neighbour id -> link weight
P:{ns}:linkmeta:<id>           hash    neighbour id -> packed {reason, label, source, at}
P:{ns}:active                  zset    active note id -> seq (the FAISS int64 id)
P:{ns}:seqs                    hash    seq -> note id (active and tombstoned)
P:{ns}:seq                     string  last seq handed out (INCR)
P:{ns}:tombstoned              zset    tombstoned note id -> time of tombstoning
P:{ns}:changes                 stream  change log the projections replay: {op: add|remove, seq}
P:{ns}:audit                   stream  one entry per mutation: who/what/when/before/after/source
P:{ns}:stats                   hash    counters and last organisation times
P:{ns}:tail                    string  packed (id, event_time, agent, created_at) of the last new
                                       note, for the next batch's sequence links
P:{ns}:lock                    string  token of the worker mutating the namespace (PX lock_ms)
P:{ns}:llm_budget:<hour>       string  LLM calls made for the namespace in that hour (epoch hours;
                                       INCR, EXPIRE 2 h); capped at llm_budget_per_hour
P:{ns}:clusters                hash    insight id -> packed sorted ids of the cluster of notes it
                                       abstracts (consolidation)
P:{ns}:judge                   list    packed {id, src, candidates} of notes waiting for the LLM
                                       link judge (ZQ_JUDGE=llm), oldest first
=============================  ======  ==========================================================
"""

from __future__ import annotations

import zlib


class Keys:
    """Key names under one prefix. Pure: no I/O."""

    def __init__(self, prefix: str = "zq", shard_count: int = 8) -> None:
        self.prefix = prefix
        self.shard_count = shard_count

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

    # global keys
    def search_queue(self) -> str:
        return f"{self.prefix}:search"

    def reply(self, job_id: str) -> str:
        return f"{self.prefix}:reply:{job_id}"

    def dead(self) -> str:
        return f"{self.prefix}:dead"

    def namespaces(self) -> str:
        return f"{self.prefix}:namespaces"

    def vcache(self, embedder: str, sha256: str) -> str:
        return f"{self.prefix}:vcache:{embedder}:{sha256}"

    # namespace keys
    def note(self, ns: str, note_id: str) -> str:
        return f"{self.prefix}:{{{ns}}}:note:{note_id}"

    def links(self, ns: str, note_id: str) -> str:
        return f"{self.prefix}:{{{ns}}}:links:{note_id}"

    def linkmeta(self, ns: str, note_id: str) -> str:
        return f"{self.prefix}:{{{ns}}}:linkmeta:{note_id}"

    def active(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:active"

    def seqs(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:seqs"

    def seq(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:seq"

    def tombstoned(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:tombstoned"

    def changes(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:changes"

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

    def judge(self, ns: str) -> str:
        return f"{self.prefix}:{{{ns}}}:judge"
