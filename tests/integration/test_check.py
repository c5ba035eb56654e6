"""``zettelq check``: the integrity check of one or every namespace from a shell."""

from __future__ import annotations

import json

import pytest

from producer import MemoryClient
from tests.conftest import drain_all
from worker.cli.main import main
from worker.context import WorkerContext
from worker.settings import WorkerSettings

TEXTS = [
    "The billing service retries failed card payments three times.",
    "Card payments that fail are retried by billing, three attempts.",
    "The weekly team meeting moved to Thursday afternoon.",
    "Thursday afternoon is now the slot of the weekly meeting.",
]


def _report(capsys: pytest.CaptureFixture[str]) -> dict[str, list[str]]:
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return {row["namespace"]: row["problems"] for row in rows}


def test_check_passes_a_consistent_namespace_and_names_a_one_sided_link(
    ctx: WorkerContext,
    client: MemoryClient,
    cli_env: WorkerSettings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = client.store_many(TEXTS, namespace="c1")
    client.store_many(TEXTS, namespace="c2")
    drain_all(ctx)
    assert main(["check", "-n", "c1", "--json"]) == 0
    assert _report(capsys) == {"c1": []}

    a = ids[0]
    b = next(iter(client.get(a, namespace="c1").links))
    ctx.redis.hdel(ctx.keys.links("c1", b), a)  # one end of the link gone

    assert main(["check", "--all", "--json"]) == 1
    report = _report(capsys)
    assert report["c2"] == []
    assert report["c1"] == [f"link {a} -> {b} is one-sided or weighted differently"]
