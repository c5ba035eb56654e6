"""Producer settings, read from ``ZQ_*`` environment variables (see docs/settings.md).

Each field's docstring is its description (``use_attribute_docstrings``): deploy/env.example is
generated from them (``python -m worker.cli.envfile``), and a test holds the two in step.

A bad value raises InvalidSetting, whose one-line message names the variable and what it expects
(``ZQ_MAX_K='abc' is not a valid integer``); unknown_variables() names the ``ZQ_`` variables no
setting reads, each with the closest real name.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from producer.errors import InvalidSetting
from producer.urls import cluster_options, is_cluster_url, is_sentinel_url, sentinel_options

ENV_PREFIX = "ZQ_"  #: prefix of every setting's environment variable
NESTED = "__"  #: separates a mapping setting's variable from a key: ZQ_NAMESPACE_KEYS__ACME

#: pydantic error type -> what the message says about the value
EXPECTED = {
    "int_parsing": "is not a valid integer",
    "int_from_float": "is not a valid integer",
    "float_parsing": "is not a valid number",
    "bool_parsing": "is not a valid boolean (true/false, 1/0, yes/no, on/off)",
    "dict_type": "is not a JSON object",
    "string_type": "is not a string",
}
#: pydantic error type of a bound -> its operator
BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


class ProducerSettings(BaseSettings):
    """What an agent process needs to talk to zettelq. Workers extend this class."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    def __init__(self, **values: Any) -> None:
        """Read the environment under ``values``; InvalidSetting names whatever is wrong."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            errors = [describe_error(self, e, values) for e in exc.errors()]
            raise InvalidSetting("; ".join(errors)) from exc
        except SettingsError as exc:
            raise InvalidSetting(describe_unparsed(self, exc)) from exc

    @classmethod
    def variable_names(cls) -> frozenset[str]:
        """The environment variable of every setting, e.g. ZQ_REDIS_URL."""
        return frozenset(f"{ENV_PREFIX}{name.upper()}" for name in cls.model_fields)

    @classmethod
    def nested_names(cls) -> frozenset[str]:
        """The variables of mapping settings, whose keys may follow: ZQ_NAMESPACE_KEYS__ACME."""
        fields = cls.model_fields.items()
        return frozenset(
            f"{ENV_PREFIX}{name.upper()}"
            for name, field in fields
            if str(field.annotation).startswith("dict")
        )

    @property
    def redis_cluster(self) -> bool:
        """Whether redis_url names a Redis Cluster."""
        return is_cluster_url(self.redis_url)

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Data Redis: notes, links, queues and replies (redis://, rediss://, unix://), a Redis
    Cluster as redis+cluster://host:port[,host:port...] (rediss+cluster:// for TLS), or a master
    watched by Sentinel as redis+sentinel://host:port[,host:port...]/service_name[/db] (the
    sentinels' addresses; rediss+sentinel:// for TLS)."""

    @field_validator("redis_url")
    @classmethod
    def _cluster_url_parses(cls, url: str) -> str:
        parse = cluster_options if is_cluster_url(url) else sentinel_options
        if is_cluster_url(url) or is_sentinel_url(url):
            try:
                parse(url)
            except InvalidSetting as exc:
                raise ValueError(str(exc).removeprefix("ZQ_REDIS_URL: ")) from None
        return url

    sentinel_password: SecretStr | None = None
    """The password the sentinels of a redis+sentinel:// ZQ_REDIS_URL ask for (their
    requirepass); unset asks them without. The URL's user and password are the master's."""

    wait_replicas: int = Field(default=0, ge=0, le=16)
    """store(), store_many() and delete() return only once their write reached this many
    replicas (Redis WAIT), else raise NotReplicated; 0 returns once the master has it (a
    failover can then lose the latest acknowledged writes). Not on a Redis Cluster."""

    wait_replicas_timeout_s: float = Field(default=1.0, gt=0)
    """How long a write waits for wait_replicas replicas before NotReplicated; below
    socket_timeout_s."""

    @model_validator(mode="after")
    def _wait_replicas_fits(self) -> ProducerSettings:
        if self.wait_replicas and is_cluster_url(self.redis_url):
            raise ValueError(
                "ZQ_WAIT_REPLICAS is not supported on a Redis Cluster (ZQ_REDIS_URL): set it to 0"
            )
        if self.wait_replicas and self.wait_replicas_timeout_s >= self.socket_timeout_s:
            raise ValueError(
                "ZQ_WAIT_REPLICAS_TIMEOUT_S must be below ZQ_SOCKET_TIMEOUT_S: the WAIT is read"
                " on a socket that times out after ZQ_SOCKET_TIMEOUT_S"
            )
        return self

    key_prefix: str = Field(default="zq", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    """Prefix of every key; two deployments can share one Redis under different prefixes."""

    shard_count: int = Field(default=8, ge=1, le=1024)
    """Namespaces are hashed onto this many shard streams. Producers and workers must agree."""

    default_namespace: str = "default"
    """Namespace used when a call names none."""

    mcp_namespace: str | None = None
    """The one namespace `zettelq mcp` over stdio binds every tool to (tools never take a
    namespace); unset means default_namespace. Over HTTP the bearer token picks it instead."""

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

    http_max_body_bytes: int = Field(default=8_388_608, ge=1_024)
    """Largest request body the HTTP API (zettelq serve) accepts; a larger one gets 413 before
    it is read."""

    token_cache_s: float = Field(default=5.0, ge=0, le=3_600)
    """How long the HTTP API and MCP over HTTP keep a verified bearer token's grant in the
    process (0 = ask Redis on every request). A revocation reaches them by pub/sub within
    milliseconds; this only bounds how long a token changed behind zettelq's back stays seen
    as it was. Not used on a Redis Cluster."""


#: the password of a URL's user info (``redis://user:password@host``), not shown in errors
URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def client_settings(
    settings: ProducerSettings | None, overrides: Mapping[str, Any]
) -> ProducerSettings:
    """The settings a client runs with: ``settings`` (read from the environment when None) with
    ``overrides`` (setting names, e.g. ``reply_timeout_s=2.0``) applied and validated as the
    environment's values are. InvalidSetting names an unknown name (with the closest one) or a
    bad value; ``settings`` itself is left as it is."""
    cls = ProducerSettings if settings is None else type(settings)
    unknown = sorted(set(overrides) - set(cls.model_fields))
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, list(cls.model_fields), n=1)
            hints.append(
                f"{name!r} is not a setting" + (f"; did you mean {close[0]!r}?" if close else "")
            )
        raise InvalidSetting("; ".join(hints))
    if settings is None:
        return ProducerSettings(**overrides)
    if not overrides:
        return settings
    return cls(**{**{name: getattr(settings, name) for name in cls.model_fields}, **overrides})


def describe_error(settings: BaseSettings, error: ErrorDetails, given: Mapping[str, Any]) -> str:
    """One failed check as ``ZQ_MAX_K='abc' is not a valid integer`` (a keyword argument is
    named as itself; a secret's value is never shown)."""
    if not error["loc"]:
        return error["msg"].removeprefix("Value error, ")
    field = str(error["loc"][0])
    name = field if field in given else f"{ENV_PREFIX}{field.upper()}"
    secret = "Secret" in str(type(settings).model_fields[field].annotation)
    value = error["input"]
    if isinstance(value, str):
        value = URL_PASSWORD.sub(r"\1***@", value)
    shown = f"{name}={'***' if secret else repr(value)}"
    return f"{shown} {_expectation(error)}"


def _expectation(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx", {})
    if kind in EXPECTED:
        return EXPECTED[kind]
    if kind in BOUNDS:
        return f"must be {BOUNDS[kind]} {next(iter(ctx.values()))}"
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx['pattern']}"
    return f"is invalid: {error['msg']}"


def describe_unparsed(settings: BaseSettings, exc: SettingsError) -> str:
    """pydantic-settings' 'error parsing value for field "x" ...' as the variable and its form."""
    if isinstance(exc.__cause__, ValidationError):
        return "; ".join(describe_error(settings, e, {}) for e in exc.__cause__.errors())
    found = re.search(r'field "(\w+)"', str(exc))
    if found is None:
        return str(exc)
    return f"{ENV_PREFIX}{found.group(1).upper()} is not valid JSON"


def unknown_variables(
    environ: Mapping[str, str],
    known: Collection[str],
    nested: Iterable[str] = (),
) -> list[str]:
    """A warning for each ``ZQ_`` variable in ``environ`` that no setting reads, naming the
    closest of ``known`` when one is close; ``nested`` variables may carry ``__KEY`` suffixes."""
    prefixes = tuple(f"{name}{NESTED}" for name in nested)
    warnings = []
    for variable in sorted(environ):
        name = variable.upper()
        if not name.startswith(ENV_PREFIX) or name in known or name.startswith(prefixes):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.append(f"{variable} is not a zettelq setting{hint}")
    return warnings
