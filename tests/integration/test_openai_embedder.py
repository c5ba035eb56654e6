"""The OpenAI-compatible embedder against a small embeddings server on 127.0.0.1 that this test
starts itself: batching, order, normalisation, retries, typed errors, timeouts, and the worker
organising and searching notes through it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from producer import MemoryClient
from tests.conftest import drain_all, make_settings
from worker.context import WorkerContext
from worker.errors import EmbedderUnavailable, EmbeddingRejected
from worker.models.factory import build_embedder
from worker.models.hashing import HashingEmbedder
from worker.models.openai import OpenAIEmbedder
from worker.runtime.servers import SearchServer

DIM = 32


@dataclass
class FakeEmbeddings:
    """What the server answers (vectors of a hashing embedder, scaled, in reverse index order),
    the statuses it fails with first, and every request it received."""

    url: str = ""
    failures: list[int] = field(default_factory=list)
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    hasher: HashingEmbedder = field(default_factory=lambda: HashingEmbedder(DIM))

    def answer(self, body: dict[str, Any], auth: str | None) -> tuple[int, dict[str, Any]]:
        self.requests.append({"input": body["input"], "model": body["model"], "auth": auth})
        time.sleep(self.delay_s)
        if self.failures:
            return self.failures.pop(0), {"error": {"message": "scripted failure"}}
        vecs = 3.0 * self.hasher.embed(body["input"])  # not normalised: the client must do it
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)
        ]
        return 200, {"object": "list", "model": body["model"], "data": data[::-1]}


@pytest.fixture
def fake() -> Iterator[FakeEmbeddings]:
    state = FakeEmbeddings()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            assert self.path == "/v1/embeddings"
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, payload = state.answer(body, self.headers.get("Authorization"))
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            if status == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: Any) -> None:
            pass  # keep pytest's output clean

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def embedder(fake: FakeEmbeddings, **options: Any) -> OpenAIEmbedder:
    return OpenAIEmbedder(fake.url, "test-model", backoff_s=0.01, **options)


def test_texts_are_sent_in_batches_and_rows_come_back_in_input_order_normalised(fake):
    texts = [f"note {i} about topic {i % 3}" for i in range(8)]
    vecs = embedder(fake, batch=3).embed(texts)
    assert [len(r["input"]) for r in fake.requests] == [3, 3, 2]
    assert [t for r in fake.requests for t in r["input"]] == texts
    assert vecs.shape == (8, DIM) and vecs.dtype == np.float32 and vecs.flags.c_contiguous
    assert np.allclose(vecs, fake.hasher.embed(texts), atol=1e-6)  # order by index, L2 = 1
    assert all(r["model"] == "test-model" for r in fake.requests)


def test_blank_texts_get_zero_rows_without_being_sent(fake):
    vecs = embedder(fake).embed(["  ", "real words here", ""])
    assert fake.requests[0]["input"] == ["real words here"]
    assert not vecs[0].any() and not vecs[2].any()
    assert np.linalg.norm(vecs[1]) == pytest.approx(1.0, abs=1e-6)


def test_dimension_and_name_come_from_the_first_response(fake):
    emb = embedder(fake)
    assert emb.name == f"openai-test-model-d{DIM}" and emb.dim == DIM
    assert len(fake.requests) == 1  # one probe, then remembered
    assert emb.embed([]).shape == (0, DIM)
    assert len(fake.requests) == 1


def test_the_api_key_goes_in_a_bearer_header_only_when_set(fake):
    embedder(fake, api_key="sk-test").embed(["a"])
    embedder(fake).embed(["b"])
    assert [r["auth"] for r in fake.requests] == ["Bearer sk-test", None]


def test_500_503_and_429_are_retried_with_backoff_until_it_succeeds(fake):
    fake.failures = [500, 503, 429]
    vecs = embedder(fake, retries=3).embed(["retry me"])
    assert len(fake.requests) == 4
    assert np.allclose(vecs, fake.hasher.embed(["retry me"]), atol=1e-6)


def test_retries_are_bounded_and_then_the_endpoint_is_unavailable(fake):
    fake.failures = [502] * 5
    with pytest.raises(EmbedderUnavailable, match="502"):
        embedder(fake, retries=2).embed(["never"])
    assert len(fake.requests) == 3


def test_401_fails_at_once_as_unavailable_not_as_the_texts_fault(fake):
    fake.failures = [401] * 5
    with pytest.raises(EmbedderUnavailable, match="401") as info:
        embedder(fake, retries=3).embed(["secret"])
    assert not isinstance(info.value, EmbeddingRejected)
    assert len(fake.requests) == 1


def test_400_fails_at_once_as_rejected_texts(fake):
    fake.failures = [400]
    with pytest.raises(EmbeddingRejected, match=r"400.*scripted failure"):
        embedder(fake, retries=3).embed(["too long"])
    assert len(fake.requests) == 1


def test_the_timeout_bounds_each_request(fake):
    fake.delay_s = 1.0
    started = time.monotonic()
    with pytest.raises(EmbedderUnavailable, match="unreachable"):
        embedder(fake, timeout_s=0.2, retries=1).embed(["slow"])
    assert time.monotonic() - started < 0.9
    assert len(fake.requests) == 2


def test_a_closed_port_is_unavailable_after_the_retries():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    emb = OpenAIEmbedder(f"http://127.0.0.1:{port}/v1", "m", retries=1, backoff_s=0.01)
    with pytest.raises(EmbedderUnavailable, match="unreachable"):
        emb.embed(["nobody listens"])


def test_settings_select_it_and_refuse_it_without_url_or_model(fake, tmp_path):
    s = make_settings(tmp_path, embedder="openai", embed_url=fake.url, embed_model="m")
    assert isinstance(build_embedder(s), OpenAIEmbedder)
    with pytest.raises(ValueError, match="ZQ_EMBED_URL"):
        build_embedder(make_settings(tmp_path, embedder="openai", embed_model="m"))
    with pytest.raises(ValueError, match="http"):
        OpenAIEmbedder("ftp://example/v1", "m")


@pytest.fixture
def openai_ctx(fake, redis_db, tmp_path) -> Iterator[WorkerContext]:
    s = make_settings(
        tmp_path, embedder="openai", embed_url=fake.url, embed_model="m", embed_retries=0
    )
    context = WorkerContext.build(s)
    yield context
    context.close()


def test_a_worker_organises_and_searches_notes_through_the_endpoint(fake, openai_ctx):
    with MemoryClient(openai_ctx.settings) as mem:
        ids = mem.store_many(
            ["Snowflake key-pair auth with Azure AD", "The cafeteria serves soup"], namespace="e"
        )
        drain_all(openai_ctx)
        server = SearchServer(openai_ctx).start()
        try:
            hits = mem.search("Snowflake auth", namespace="e", k=1)
        finally:
            server.stop()
    assert [h.id for h in hits] == [ids[0]]
    raw = openai_ctx.redis.hget(openai_ctx.keys.note("e", ids[0]), "embedder")
    assert raw == b"openai-m-d32"


def test_an_unavailable_endpoint_keeps_the_batch_queued_instead_of_dead_lettering(fake, openai_ctx):
    with MemoryClient(openai_ctx.settings) as mem:
        nid = mem.store("kept safe while the model is down", namespace="down")
        openai_ctx.embedder.embed(["learn the dimension first"])
        fake.failures = [503]
        with pytest.raises(EmbedderUnavailable):
            drain_all(openai_ctx)
        assert openai_ctx.redis.xlen(openai_ctx.keys.dead()) == 0
        assert mem.stats("down").pending == 1
        assert drain_all(openai_ctx) == 1  # the endpoint is back
        assert mem.get(nid, namespace="down").content == "kept safe while the model is down"
