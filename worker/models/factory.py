"""Which embedder a process runs. ``build_embedder`` looks ZQ_EMBEDDER up in BUILTIN, one
factory of the settings per built-in name; any other value goes to ``load_embedder``: "hash",
or an import path ``package.module:factory`` whose factory takes no arguments."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import cast

from worker.models import openai, sentence_transformers
from worker.models.hashing import Embedder, HashingEmbedder
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

#: ZQ_EMBEDDER's built-in names (besides "hash") and what builds each from the settings
BUILTIN: dict[str, Callable[[WorkerSettings], Embedder]] = {
    "minilm": sentence_transformers.from_settings,
    "sentence-transformers": sentence_transformers.from_settings,
    "openai": openai.from_settings,
}


def build_embedder(s: WorkerSettings) -> Embedder:
    """The embedder the settings name: hash, minilm, a model directory, an OpenAI-compatible
    endpoint, or an import path."""
    factory = BUILTIN.get(s.embedder)
    return factory(s) if factory else load_embedder(s.embedder, s.embed_dim)


def load_embedder(spec: str, dim: int) -> Embedder:
    """Build the embedder named by `spec`: "hash" or an import path "package.module:factory".

    The factory is called with no arguments and must return an object with `name`, `dim` and
    `embed`. Raise ValueError for an unknown spec, an import failure or a malformed embedder.
    """
    if spec == "hash":
        embedder: Embedder = HashingEmbedder(dim)
    else:
        embedder = _check_embedder(spec, _import_factory(spec)())
    log.info("embedder loaded spec=%s name=%s dim=%d", spec, embedder.name, embedder.dim)
    return embedder


def _import_factory(spec: str) -> Callable[[], object]:
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise ValueError(f"unknown embedder spec {spec!r}: use 'hash' or 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import embedder module {module_name!r} ({exc})") from exc
    factory: object = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"embedder factory {spec!r} is missing or not callable")
    return factory


def _check_embedder(spec: str, candidate: object) -> Embedder:
    name = getattr(candidate, "name", None)
    dim = getattr(candidate, "dim", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"embedder from {spec!r} lacks a non-empty str `name`")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
        raise ValueError(f"embedder from {spec!r} lacks a positive int `dim`")
    if not callable(getattr(candidate, "embed", None)):
        raise ValueError(f"embedder from {spec!r} lacks a callable `embed`")
    return cast(Embedder, candidate)
