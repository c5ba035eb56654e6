"""The README's quickstart runs as written, and its settings table is complete."""

from __future__ import annotations

import re
from pathlib import Path

from worker.settings import WorkerSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_quickstart_runs_against_a_worker(settings, server, monkeypatch, capsys):
    code = re.search(r"## Quickstart.*?```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None
    assert len(code.group(1).strip().splitlines()) <= 15
    monkeypatch.setenv("ZQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("ZQ_KEY_PREFIX", settings.key_prefix)
    monkeypatch.setenv("ZQ_SHARD_COUNT", str(settings.shard_count))
    exec(compile(code.group(1), "README quickstart", "exec"), {})
    out = capsys.readouterr().out
    assert "Snowflake" in out and "key-pair" in out


def test_every_setting_is_documented_with_its_default():
    text = README.read_text()
    for name in WorkerSettings.model_fields:
        assert f"`ZQ_{name.upper()}`" in text, f"ZQ_{name.upper()} missing from README"
