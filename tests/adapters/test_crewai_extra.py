"""Without crewai installed (the dev venv), the CrewAI door says which extra to install."""

from __future__ import annotations

import importlib
import importlib.util

import pytest


def test_the_crewai_door_names_its_extra_when_crewai_is_missing():
    if importlib.util.find_spec("crewai") is not None:
        pytest.skip("crewai is installed here (.venv-crewai); this checks a venv without it")
    with pytest.raises(ImportError, match=r"pip install 'zettelq\[crewai\]'"):
        importlib.import_module("producer.adapters.crewai")
