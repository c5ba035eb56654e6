from __future__ import annotations

import numpy as np
import pytest

from producer.protocol import vector_values
from worker import vectors


def unit(dim: int, seed: int) -> np.ndarray:
    vec = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return vec / np.linalg.norm(vec)


@pytest.mark.parametrize("dim", [16, 255, 256, 384])
def test_float32_is_kept_exactly_and_float16_within_a_thousandth_of_a_cosine(dim: int) -> None:
    vec, other = unit(dim, 1), unit(dim, 2)
    full = vectors.encode(vec, "float32")
    half = vectors.encode(vec, "float16")
    assert len(full) == 4 * dim and len(half) == 2 * dim + 1 and half[:1] == b"h"
    assert vectors.decode(full).tobytes() == vec.tobytes()
    back = vectors.decode(half)
    assert back.dtype == np.float32 and back.shape == (dim,)
    assert abs(float(back @ other) - float(vec @ other)) < 1e-3
    assert vectors.dims(full) == vectors.dims(half) == dim and vectors.dims(b"") == 0
    assert vectors.encode(back, "float16") == half  # re-encoding a decoded float16 changes nothing


@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_as_stored_is_the_vector_that_reads_back(storage: vectors.Storage) -> None:
    vec = unit(256, 4)
    kept = vectors.as_stored(vec, storage)
    assert kept.dtype == np.float32
    assert kept.tobytes() == vectors.decode(vectors.encode(vec, storage)).tobytes()


def test_the_producer_reads_both_layouts_as_the_worker_does() -> None:
    vec = unit(32, 3)
    for storage in ("float32", "float16"):
        raw = vectors.encode(vec, storage)
        assert vector_values(raw) == vectors.decode(raw).tolist()


@pytest.mark.parametrize("raw", [b"x" * 7, b"h" * 6, b"\x00" * 1022])
def test_stored_bytes_of_neither_layout_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="stored"):
        vectors.decode(raw)
