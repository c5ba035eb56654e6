"""How a CLI command fails: the line and the exit code each kind of error ends with."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError

from producer import InvalidSetting, NotFound, Unavailable
from worker.cli.failure import EXIT_FAILED, EXIT_USAGE, describe, redacted


def test_each_kind_of_error_has_its_line_and_code() -> None:
    missing = ModuleNotFoundError("No module named 'faiss'", name="faiss")
    assert describe(missing, "check", None).message == (
        "'zettelq check' needs the worker extra: pip install 'zettelq[worker]'"
    )
    assert describe(InvalidSetting("ZQ_MAX_K='x' is not a valid integer"), "get", None).code == (
        EXIT_USAGE
    )
    assert describe(NotFound("no active note 'x'"), "get", None).code == EXIT_FAILED
    down = Unavailable("Redis unavailable")
    down.__cause__ = RedisConnectionError("Connection refused")
    assert describe(down, "stats", "redis://:pw@h:1/0").message == (
        "cannot reach Redis at redis://:***@h:1/0 (Connection refused); is Redis running?"
        " `zettelq dev` starts one"
    )
    odd = describe(RuntimeError("line one\nline two"), "get", None)
    assert odd == describe(RuntimeError("line one line two"), "get", None)
    assert odd.message.endswith("(run with --debug for the traceback)")


def test_a_url_loses_only_its_password() -> None:
    assert redacted("redis://app:s3cret@db:6379/0") == "redis://app:***@db:6379/0"
    assert redacted("rediss://db:6380") == "rediss://db:6380"
