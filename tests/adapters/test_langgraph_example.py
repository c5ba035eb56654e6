"""examples/langgraph_team.py runs as a user would run it (a subprocess reading ZQ_ variables)
against the test's Redis, with the in-thread search server organising its notes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph.graph", reason="needs the langgraph extra")

from producer import MemoryClient
from producer.adapters.langgraph.mapping import encode_namespace
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_team.py"


def test_the_langgraph_team_example_runs_and_its_agents_read_each_other(
    cli_env: WorkerSettings, server: SearchServer, client: MemoryClient
) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "researcher: stored 3 findings",
        "planner: read finding-auth, finding-rotation; wrote plan",
        "reviewer: read 4 notes by planner, researcher; approved",
        "review: plan approved",
    ]
    team = encode_namespace(("acme", "snowflake-migration"))
    hits = client.search("plan approved", namespace=team)
    assert hits[0].metadata["langgraph"]["key"] == "review"  # type: ignore[index]
    assert hits[0].agent == "team"


def test_the_readme_langgraph_snippet_runs_against_a_worker(
    cli_env: WorkerSettings, server: SearchServer, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    code = re.search(r"## LangGraph\n.*?```python\n(.*?)```", readme, re.S)
    assert code is not None
    exec(compile(code.group(1), "README LangGraph", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out == "Ann drinks green tea\n"
