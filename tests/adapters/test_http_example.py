"""examples/http_agents.py, three agents that share one namespace over the HTTP API with nothing
but the standard library, run as written against a real uvicorn, Redis and search thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="pip install -e '.[server]' to run this")

from producer.adapters.http import create_app
from producer.adapters.tokens import TokenStore
from tests.adapters.conftest import uvicorn_serving
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "http_agents.py"


def test_the_writer_summarises_what_the_other_agents_stored(
    settings: WorkerSettings, server: SearchServer, tokens: TokenStore
) -> None:
    secret, _ = tokens.create(read=["mission"], write=["mission"], label="example")
    with uvicorn_serving(create_app(settings)) as url:
        env = {**os.environ, "ZETTELQ_URL": url, "ZETTELQ_TOKEN": secret}
        out = subprocess.run(
            [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Summary from the memories of analyst, scout:")
    assert "Shackleton the best site for the base" in out.stdout
    code = EXAMPLE.read_text()
    assert "import producer" not in code and "from producer" not in code  # plain HTTP only
