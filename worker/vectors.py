"""How a note's vector is kept in its hash (field ``vec``): the one codec every reader and writer
of stored vectors goes through.

``float32`` (the default) is the little-endian float32 row, 4 bytes per dimension. ``float16``
(ZQ_VECTOR_STORAGE=float16) is one tag byte (TAG_FLOAT16) then the little-endian float16 row, 2
bytes per dimension: half the memory of the largest field of a note, at a precision (about 1e-3
of a cosine) the IVF index already keeps its lists in (worker/index/kinds.py). The two read
apart by length alone (a float16 row's is odd, a float32 row's a multiple of 4), so a namespace
written under either setting, or both, reads the same, and a change of setting needs no
migration. Vectors are decoded to float32, as every index and ranking step uses them.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from producer.protocol import VECTOR_TAG_FLOAT16 as TAG_FLOAT16

Storage = Literal["float32", "float16"]


def encode(vec: npt.NDArray[np.float32], storage: Storage) -> bytes:
    """The stored bytes of one vector."""
    if storage == "float16":
        return TAG_FLOAT16 + vec.astype("<f2").tobytes()
    return vec.astype("<f4", copy=False).tobytes()


def as_stored(vec: npt.NDArray[np.float32], storage: Storage) -> npt.NDArray[np.float32]:
    """``vec`` as ``decode(encode(vec, storage))`` gives it back: the vector a worker links and
    indexes a new note by, so the worker that ingests a note holds the same one as every process
    that reads it from Redis later."""
    if storage == "float16":
        return vec.astype("<f2").astype(np.float32)
    return vec.astype(np.float32, copy=False)


def decode(raw: bytes) -> npt.NDArray[np.float32]:
    """The float32 vector of stored bytes; ValueError when they are neither layout (the hash is
    read from Redis: untrusted)."""
    if len(raw) % 2:
        if raw[:1] != TAG_FLOAT16:
            raise ValueError(f"a stored vector of odd length {len(raw)} without the float16 tag")
        return np.frombuffer(raw, dtype="<f2", offset=1).astype(np.float32)
    if len(raw) % 4:
        raise ValueError(f"a stored float32 vector's length must be a multiple of 4: {len(raw)}")
    return np.frombuffer(raw, dtype="<f4")


def dims(raw: bytes) -> int:
    """The dimension of stored bytes (0 for none)."""
    return (len(raw) - 1) // 2 if len(raw) % 2 else len(raw) // 4
