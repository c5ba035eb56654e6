"""Settings errors name the ZQ_ variable and what it expects; unknown ZQ_ variables are named
with the closest real one; every ZQ_ name the code reads is a setting or a known other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from producer import InvalidInput, InvalidSetting, ProducerSettings
from producer.settings import unknown_variables
from worker.settings import OTHER_VARIABLES, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
#: tests that set misspelt ZQ_ names on purpose
MISSPELLING = (
    Path(__file__),
    ROOT / "tests" / "integration" / "test_cli.py",
    ROOT / "tests" / "adapters" / "test_mcp_transports.py",
)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("ZQ_MAX_K", "abc", "ZQ_MAX_K='abc' is not a valid integer"),
        ("ZQ_MAX_K", "0", "ZQ_MAX_K='0' must be >= 1"),
        ("ZQ_REPLY_TIMEOUT_S", "soon", "ZQ_REPLY_TIMEOUT_S='soon' is not a valid number"),
        ("ZQ_KEY_PREFIX", "a b", "ZQ_KEY_PREFIX='a b' must match ^[A-Za-z0-9_.-]{1,32}$"),
        ("ZQ_NAMESPACE_KEYS", "not json", "ZQ_NAMESPACE_KEYS is not valid JSON"),
        ("ZQ_NAMESPACE_KEYS", '{"acme": 3}', "ZQ_NAMESPACE_KEYS=*** is not a string"),
    ],
)
def test_a_bad_producer_setting_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidSetting) as caught:
        ProducerSettings()
    assert str(caught.value) == message
    assert isinstance(caught.value, InvalidInput) and isinstance(caught.value, ValueError)


def test_a_bad_worker_setting_names_its_variable_and_keywords_name_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZQ_SERVE_SEARCH", "maybe")
    monkeypatch.setenv("ZQ_ANN_INDEX", "flat")
    with pytest.raises(InvalidSetting) as caught:
        WorkerSettings(batch_size=0)
    assert str(caught.value) == (
        "batch_size=0 must be >= 1; ZQ_ANN_INDEX='flat' must be 'ivf' or 'hnsw'; "
        "ZQ_SERVE_SEARCH='maybe' is not a valid boolean (true/false, 1/0, yes/no, on/off)"
    )


def test_a_secret_value_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZQ_LLM_API_KEY", "sk-very-secret")
    with pytest.raises(InvalidSetting) as caught:
        WorkerSettings(llm_api_key=["sk-very-secret"])
    assert "sk-very-secret" not in str(caught.value) and "llm_api_key=***" in str(caught.value)


def test_unknown_variables_are_named_with_the_closest_setting() -> None:
    environ = {
        "ZQ_MAX_KK": "1",
        "zq_redis_ulr": "x",
        "ZQ_MAX_K": "1",
        "ZQ_NAMESPACE_KEYS__ACME": "secret",
        "ZQ_QWERTYUIOP": "1",
        "PATH": "/bin",
    }
    known = WorkerSettings.variable_names()
    assert unknown_variables(environ, known, WorkerSettings.nested_names()) == [
        "ZQ_MAX_KK is not a zettelq setting; did you mean ZQ_MAX_K?",
        "ZQ_QWERTYUIOP is not a zettelq setting",
        "zq_redis_ulr is not a zettelq setting; did you mean ZQ_REDIS_URL?",
    ]


def test_every_zq_name_the_code_reads_is_a_setting_or_a_known_other() -> None:
    """A ZQ_ variable read outside the settings classes must be in OTHER_VARIABLES, or the
    CLI would warn that it is not a zettelq setting."""
    known = WorkerSettings.variable_names() | OTHER_VARIABLES
    files = [*ROOT.glob("producer/**/*.py"), *ROOT.glob("worker/**/*.py")]
    files += [*ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/*"), *ROOT.glob("deploy/**/*")]
    names = set()
    for path in (p for p in files if p.is_file() and p not in MISSPELLING):
        names |= set(re.findall(r"\bZQ_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    nested = tuple(f"{n}__" for n in WorkerSettings.nested_names())
    assert {n for n in names if not n.startswith(nested)} - known == set()
