"""An embedder for any OpenAI-compatible ``POST {base}/embeddings`` endpoint: OpenAI, Ollama,
vLLM, llama.cpp's server, LocalAI. Standard library only (urllib + json).

Texts go out in requests of at most ``batch`` inputs; each request is retried with exponential
backoff (honouring ``Retry-After``) after a timeout, a connection error, 429 or 5xx. Any other
4xx fails at once. The dimension is learnt from the first response, so the embedder's ``name``
(``openai-<model>-d<dim>``) costs one small request when it is needed before any embedding.
Redirects are refused: the API key is never sent to a host other than the configured one.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from email.message import Message
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from worker.errors import EmbedderUnavailable, EmbeddingError, EmbeddingRejected
from worker.models import openai_http
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]

BACKOFF_S = 0.5  #: wait before the first retry; doubled for each one after it
BACKOFF_MAX_S = 8.0  #: longest wait between two attempts, Retry-After included
MAX_RESPONSE_BYTES = 256 << 20  #: a larger response body is refused
PROBE_TEXT = "dimension probe"  #: embedded once when the dimension is needed before any text
#: 4xx statuses retried like 5xx (request timeout, too many requests)
RETRIED_STATUSES = frozenset({408, 429})
#: 4xx statuses that are a configuration error (key, permission, URL or model), not the texts'
CONFIG_STATUSES = frozenset({401, 403, 404, 407})


class OpenAIEmbedder:
    """Vectors from an OpenAI-compatible embeddings endpoint, L2-normalised, in input order."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        batch: int = 64,
        retries: int = 2,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"embedding endpoint must be an http(s) URL, got {base_url!r}")
        if not model or batch < 1 or retries < 0 or timeout_s <= 0:
            raise ValueError("need a model name, batch >= 1, retries >= 0 and timeout_s > 0")
        self.url = base_url.rstrip("/") + "/embeddings"
        self.model = model
        self.timeout_s = timeout_s
        self.batch = batch
        self.retries = retries
        self.backoff_s = backoff_s
        self._headers = openai_http.json_headers(api_key)
        self._opener = openai_http.opener()
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._request([PROBE_TEXT])
        assert self._dim is not None, "a successful response sets the dimension"
        return self._dim

    @property
    def name(self) -> str:
        return f"openai-{self.model}-d{self.dim}"

    def embed(self, texts: Sequence[str]) -> Vector:
        """Embed in requests of at most ``batch`` texts; blank texts get a zero row unsent."""
        sent = [i for i, text in enumerate(texts) if text.strip()]
        chunks = [
            self._request([texts[i] for i in sent[start : start + self.batch]])
            for start in range(0, len(sent), self.batch)
        ]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if chunks:
            out[sent] = _normalise(np.vstack(chunks))
        return out

    def _request(self, texts: list[str]) -> Vector:
        """One request's rows, retried with backoff after a transient failure."""
        body = json.dumps({"model": self.model, "input": texts}).encode()
        attempt = 0
        while True:
            try:
                return self._check(self._post(body), len(texts))
            except _Transient as exc:
                if attempt >= self.retries:
                    raise
                wait = _backoff(self.backoff_s, attempt, exc.retry_after_s)
                attempt += 1
                log.warning("embedding request failed (%s); retry %d in %.2fs", exc, attempt, wait)
                time.sleep(wait)

    def _post(self, body: bytes) -> Any:
        request = urllib.request.Request(self.url, data=body, headers=self._headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise _http_error(self.url, exc) from exc
        except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets
            raise _Transient(f"{self.url} unreachable: {exc}") from exc
        if len(raw) > MAX_RESPONSE_BYTES:
            raise EmbedderUnavailable(f"{self.url} sent more than {MAX_RESPONSE_BYTES} bytes")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise EmbedderUnavailable(f"{self.url} did not answer with JSON") from exc

    def _check(self, payload: Any, expected: int) -> Vector:
        """A response's rows in input order (by ``index``), all of the embedder's dimension."""
        try:
            items = sorted(payload["data"], key=lambda item: int(item["index"]))
            indices = [int(item["index"]) for item in items]
            rows = np.array([item["embedding"] for item in items], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbedderUnavailable(f"{self.url} answered without data[].embedding") from exc
        if indices != list(range(expected)):
            raise EmbedderUnavailable(f"{self.url} returned {len(items)} rows for {expected} texts")
        dim = rows.shape[1] if rows.ndim == 2 else 0
        if dim == 0 or (self._dim is not None and dim != self._dim):
            raise EmbedderUnavailable(
                f"{self.url} returned rows of shape {rows.shape[1:]}, expected {self._dim}"
            )
        self._dim = dim
        return rows


class _Transient(EmbedderUnavailable):
    """A failure worth retrying: timeout, connection error, 429 or 5xx."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _backoff(base_s: float, attempt: int, retry_after_s: float | None) -> float:
    """Exponential backoff with up to 25% jitter, at least Retry-After, at most BACKOFF_MAX_S."""
    wait = base_s * 2.0**attempt * (1 + random.random() / 4)
    return min(max(wait, retry_after_s or 0.0), BACKOFF_MAX_S)


def _http_error(url: str, exc: urllib.error.HTTPError) -> EmbeddingError:
    """The typed error for an HTTP error status, with the start of the server's explanation."""
    detail = exc.read(500).decode("utf-8", "replace").strip() if exc.fp else ""
    message = f"{url} answered {exc.code} {exc.reason}: {detail}".rstrip(": ")
    if exc.code in RETRIED_STATUSES or exc.code >= 500:
        return _Transient(message, _retry_after(exc.headers))
    if exc.code < 400:
        return EmbedderUnavailable(f"{message} (redirects are not followed: set the final URL)")
    if exc.code in CONFIG_STATUSES:
        return EmbedderUnavailable(message)
    return EmbeddingRejected(message)


def _retry_after(headers: Message | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to the exponential backoff


def _normalise(rows: Vector) -> Vector:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    np.divide(rows, norms, out=rows, where=norms > 0)
    return np.ascontiguousarray(rows, dtype=np.float32)


def from_settings(s: WorkerSettings) -> OpenAIEmbedder:
    """``ZQ_EMBEDDER=openai``: the endpoint and model the settings name."""
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
