"""Worker settings: the producer's plus the pipeline's, all ``ZQ_*`` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from producer.settings import ProducerSettings


class WorkerSettings(ProducerSettings):
    """Everything a worker or beat process reads from the environment."""

    #: Celery broker; defaults to redis_url (the broker cannot run on Redis Cluster).
    broker_url: str | None = None
    #: Most jobs organised in one batch, and how long a drain waits to fill one.
    batch_size: int = Field(default=256, ge=1, le=10_000)
    batch_wait_ms: int = Field(default=50, ge=0, le=5_000)
    #: Shard lease; jobs of a killed worker are reclaimed after at most this long.
    lease_s: float = Field(default=10.0, ge=1.0)
    #: How often the dispatcher sweeps every shard for backlog without a live drain.
    sweep_interval_s: float = Field(default=1.0, gt=0)
    #: Embedder: "hash" (offline default) or "package.module:factory".
    embedder: str = "hash"
    #: Dimension of the hashing embedder.
    embed_dim: int = Field(default=256, ge=16, le=4096)
    #: Candidates looked up per new note, cosine a candidate needs to be linked (calibrated for
    #: the hashing embedder; about 0.5 suits MiniLM), and links per new note.
    link_k: int = Field(default=10, ge=0, le=200)
    link_threshold: float = Field(default=0.15, ge=-1.0, le=1.0)
    max_links: int = Field(default=8, ge=0, le=200)
    #: Namespaces switch from a flat FAISS scan to HNSW past this many notes.
    hnsw_threshold: int = Field(default=20_000, ge=1)
    #: Where workers keep FAISS snapshots (per host; a lost directory is rebuilt from Redis).
    index_dir: Path = Path("var/index")
    #: Eviction: active notes kept per namespace (0 = no cap).
    max_notes: int = Field(default=100_000, ge=0)
    #: Recency half-life used by ranking and eviction.
    recency_half_life_days: float = Field(default=30.0, gt=0)
    #: Dense candidates fetched per search before ranking.
    search_candidates: int = Field(default=50, ge=1, le=2_000)
    #: Search-serving threads per worker process.
    search_threads: int = Field(default=1, ge=1, le=64)
    #: Beat intervals.
    evict_every_s: float = Field(default=300.0, gt=0)
    snapshot_every_s: float = Field(default=600.0, gt=0)
    #: Change-log entries kept per namespace (older ones force a rebuild from the notes).
    changelog_max: int = Field(default=1_000_000, ge=1_000)
    #: Entries kept in the dead-letter stream.
    dead_max: int = Field(default=100_000, ge=100)
    #: Refuse every job not signed with its namespace's key from namespace_keys: stores and
    #: deletes are dead-lettered (and audited), searches answered with an error.
    require_signatures: bool = False

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url
