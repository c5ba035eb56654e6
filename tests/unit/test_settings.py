"""Settings errors name the ZQ_ variable and what it expects; unknown ZQ_ variables are named
with the closest real one; every ZQ_ name the code reads is a setting or a known other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from producer import AsyncMemoryClient, InvalidInput, InvalidSetting, MemoryClient, ProducerSettings
from producer.settings import client_settings, unknown_variables
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


def test_a_clients_keywords_override_the_settings_it_is_given_and_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZQ_REPLY_TIMEOUT_S", "7")
    given = WorkerSettings(redis_url="redis://127.0.0.1:1/3", batch_size=5)
    merged = client_settings(given, {"reply_timeout_s": 0.2, "key_prefix": "other"})
    assert isinstance(merged, WorkerSettings)  # a worker's settings stay a worker's
    assert (merged.reply_timeout_s, merged.key_prefix) == (0.2, "other")
    assert (merged.redis_url, merged.batch_size) == (given.redis_url, 5)
    assert (given.reply_timeout_s, given.key_prefix) == (7.0, "zq")  # left as it was
    assert client_settings(given, {}) is given
    with MemoryClient(given, reply_timeout_s=0.2) as client:  # nothing connects yet
        assert client.settings.reply_timeout_s == 0.2
    assert AsyncMemoryClient(given, reply_timeout_s=0.3).settings.reply_timeout_s == 0.3
    assert client_settings(None, {"reply_timeout_s": 3}).reply_timeout_s == 3.0
    assert client_settings(None, {}).reply_timeout_s == 7.0  # the environment's
    with pytest.raises(InvalidSetting, match=r"^reply_timeout_s=-1 must be > 0.0$"):
        client_settings(given, {"reply_timeout_s": -1})
    for settings in (given, None):
        with pytest.raises(InvalidSetting) as caught:
            client_settings(settings, {"reply_timeout": 1, "zzz": 2})
        assert str(caught.value) == (
            "'reply_timeout' is not a setting; did you mean 'reply_timeout_s'?; "
            "'zzz' is not a setting"
        )


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
