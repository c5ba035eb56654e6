"""Text to vectors: the ``Embedder`` protocol and the offline ``HashingEmbedder`` (``hashing``),
sentence-transformers models from a local directory (``sentence_transformers``), any
OpenAI-compatible embeddings endpoint (``openai``, over ``openai_http``, which the chat client
shares), ``factory`` that picks one from the settings, and a Redis cache of vectors by text
(``vector_cache``). Model code is imported only when its embedder is chosen."""

from worker.models.factory import build_embedder, load_embedder
from worker.models.hashing import Embedder, HashingEmbedder
from worker.models.vector_cache import embed_cached

__all__ = [
    "Embedder",
    "HashingEmbedder",
    "build_embedder",
    "embed_cached",
    "load_embedder",
]
