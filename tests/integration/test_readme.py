"""The README's quickstart runs as written, and docs/settings.md documents every setting."""

from __future__ import annotations

import re
from pathlib import Path

from producer.settings import ProducerSettings
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETTINGS_DOC = ROOT / "docs" / "settings.md"


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
    text = SETTINGS_DOC.read_text()
    for name in [*ProducerSettings.model_fields, *WorkerSettings.model_fields]:
        row = re.search(rf"^\| `ZQ_{name.upper()}` \| [^|]+ \|", text, re.M)
        assert row is not None, f"ZQ_{name.upper()} has no row in docs/settings.md"
