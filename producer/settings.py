"""Producer settings, read from ``ZQ_*`` environment variables (see docs/settings.md).

Each field's docstring is its description (``use_attribute_docstrings``): deploy/env.example is
generated from them (``python -m worker.envfile``), and a test holds the two in step.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProducerSettings(BaseSettings):
    """What an agent process needs to talk to zettelq. Workers extend this class."""

    model_config = SettingsConfigDict(
        env_prefix="ZQ_",
        env_nested_delimiter="__",
        extra="ignore",
        use_attribute_docstrings=True,
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Data Redis: notes, links, queues and replies (redis://, rediss://, unix://)."""

    key_prefix: str = Field(default="zq", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    """Prefix of every key; two deployments can share one Redis under different prefixes."""

    shard_count: int = Field(default=8, ge=1, le=1024)
    """Namespaces are hashed onto this many shard streams. Producers and workers must agree."""

    default_namespace: str = "default"
    """Namespace used when a call names none."""

    reply_timeout_s: float = Field(default=10.0, gt=0)
    """How long search()/context()/flush() wait for a worker's reply by default."""

    result_ttl_s: int = Field(default=60, ge=1)
    """How long an unread reply stays in Redis."""

    socket_timeout_s: float = Field(default=5.0, gt=0)
    """Socket connect/read timeout towards Redis; bounds how long a call can hang on a dead
    server."""

    max_content_bytes: int = Field(default=32_768, ge=1)
    """Largest note content, in UTF-8 bytes."""

    max_metadata_bytes: int = Field(default=8_192, ge=0)
    """Largest metadata mapping, in packed (msgpack) bytes."""

    max_tags: int = Field(default=32, ge=0)
    """Most tags per note."""

    max_tag_chars: int = Field(default=64, ge=1)
    """Longest tag, in characters."""

    max_batch: int = Field(default=1_000, ge=1)
    """Most notes in one store_many() call."""

    max_k: int = Field(default=200, ge=1)
    """Largest k a search may ask for."""

    max_pending: int = Field(default=1_000_000, ge=0)
    """store() raises Backpressure when a shard stream holds more unorganised jobs than this (0
    turns the check off)."""

    redis_retries: int = Field(default=2, ge=0, le=10)
    """Retries of a Redis command after a connection error or timeout (exponential backoff up to
    half a second). With socket_timeout_s it bounds how long a call takes on a dead server."""

    namespace_keys: dict[str, SecretStr] = Field(default_factory=dict)
    """Per-namespace signing keys this process holds, as JSON: {"acme": "secret", ...}. A producer
    signs its jobs with them; a worker verifies jobs with them (see require_signatures). A
    producer should hold only the keys of its own namespaces."""

    organise_timeout_s: float = Field(default=120.0, gt=0, le=300)
    """How long organise() waits for a worker to run every periodic job of a namespace."""
