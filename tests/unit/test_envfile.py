"""deploy/env.example is generated from the settings classes and stays in step with them: every
ZQ_ setting once, with its default and description, commented out so that it changes nothing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic.fields import FieldInfo

from worker.cli.envfile import entry, render
from worker.settings import WorkerSettings

ENV_EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "env.example"
SETTING = re.compile(r"^# (ZQ_[A-Z0-9_]+)=(.*)$")


def settings_lines() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = SETTING.match(line)
        if m:
            assert m.group(1) not in found, f"{m.group(1)} twice"
            found[m.group(1)] = m.group(2)
    return found


def test_env_example_is_what_the_settings_classes_generate() -> None:
    assert ENV_EXAMPLE.read_text() == render(), (
        "deploy/env.example is out of step with the settings classes; regenerate it with "
        "`python -m worker.cli.envfile > deploy/env.example`"
    )


def test_env_example_names_every_setting_once_and_nothing_else() -> None:
    expected = {f"ZQ_{name.upper()}" for name in WorkerSettings.model_fields}

    assert set(settings_lines()) == expected


def test_env_example_sets_nothing_as_it_stands() -> None:
    live = [line for line in ENV_EXAMPLE.read_text().splitlines() if line.strip()]

    assert all(line.startswith("#") for line in live)


def test_uncommenting_every_default_changes_no_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("ZQ_")]:
        monkeypatch.delenv(name)
    uncommented = tmp_path / "zettelq.env"
    values = {name: value for name, value in settings_lines().items() if value}
    uncommented.write_text("".join(f"{name}={value}\n" for name, value in values.items()))

    from_file = WorkerSettings(_env_file=uncommented)  # type: ignore[call-arg]

    assert len(values) > 80
    assert from_file.model_dump() == WorkerSettings(_env_file=None).model_dump()  # type: ignore[call-arg]


def test_a_setting_without_a_description_cannot_be_rendered() -> None:
    with pytest.raises(ValueError, match="_UNDOCUMENTED has no description"):
        entry("undocumented", FieldInfo(default=1))
