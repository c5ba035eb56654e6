"""Fixtures and helpers the door tests share: a token store under the test's key prefix, an
ASGI app served by a real uvicorn on 127.0.0.1 (imported only by tests that have the extra),
and the token reads (HGETALLs) a request costs Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis import Redis

from producer.adapters.tokens import TokenStore
from worker.runtime.devserver import free_port
from worker.settings import WorkerSettings


@pytest.fixture
def tokens(settings: WorkerSettings) -> Iterator[TokenStore]:
    store = TokenStore.from_settings(settings)
    yield store
    store.close()


@contextmanager
def uvicorn_serving(app: Any, timeout_s: float = 10.0) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 and a free port, in a thread; yields its URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)


def token_reads(redis_db: Redis, request: Callable[[], object]) -> int:
    """The HGETALLs (token reads) Redis served while ``request`` ran: 0 when the door answered
    from its grant cache, 1 when it read the token."""
    redis_db.config_resetstat()
    request()
    stats: dict[str, int] = redis_db.info("commandstats").get("cmdstat_hgetall", {})
    return stats.get("calls", 0)


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    """Call ``check`` until it holds; AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)
