"""``zettelq`` as a person meets it, run as a real process: every failure is one line on stderr
(``zettelq: error: ...``) with a non-zero exit code and no traceback unless asked for; results
are tables or JSON lines; context, connected and delete work against the worker code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from redis import Redis

from producer import MemoryClient
from producer.keys import Keys
from tests.conftest import drain_all
from tests.e2e.workers import wait_until
from worker.context import WorkerContext
from worker.runtime.devserver import free_port
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
NS = "cli"


def zettelq(
    *args: str, python: str = sys.executable, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``zettelq ARGS`` in a process of its own with this environment (ZQ_DEBUG unset)."""
    base = {k: v for k, v in os.environ.items() if k != "ZQ_DEBUG"}
    return subprocess.run(
        [python, "-m", "worker.cli.main", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def assert_one_error_line(out: subprocess.CompletedProcess[str], code: int) -> str:
    """The run failed with ``code`` and said why in one line, without a traceback."""
    assert out.returncode == code, out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("zettelq: error: ")
    assert "Traceback" not in out.stderr and out.stdout == ""
    return out.stderr.removeprefix("zettelq: error: ").strip()


def test_a_bad_namespace_is_one_line_and_exit_2(cli_env: WorkerSettings) -> None:
    message = assert_one_error_line(zettelq("get", "some-id", "-n", "bad{ns}"), 2)
    assert message.startswith("namespace must be") and "'bad{ns}'" in message


def test_a_missing_note_is_one_line_and_exit_1(cli_env: WorkerSettings) -> None:
    message = assert_one_error_line(zettelq("get", "no-such-note", "-n", NS), 1)
    assert message == f"no active note 'no-such-note' in namespace '{NS}'"


def test_a_dead_redis_is_named_with_a_hint(cli_env: WorkerSettings) -> None:
    url = f"redis://user:hunter2@127.0.0.1:{free_port()}/0"
    for args in (["dead", "list"], ["stats"], ["store", "a note"]):
        message = assert_one_error_line(zettelq(*args, ZQ_REDIS_URL=url), 1)
        assert message.startswith(f"cannot reach Redis at {url.replace('hunter2', '***')} (")
        assert message.endswith("is Redis running? `zettelq dev` starts one")


def test_a_bad_setting_names_its_variable_and_type(cli_env: WorkerSettings) -> None:
    message = assert_one_error_line(zettelq("stats", ZQ_MAX_K="abc"), 2)
    assert message == "ZQ_MAX_K='abc' is not a valid integer"
    message = assert_one_error_line(zettelq("stats", ZQ_ANN_INDEX="flat"), 2)
    assert message == "ZQ_ANN_INDEX='flat' must be 'ivf' or 'hnsw'"


def test_debug_adds_the_traceback(cli_env: WorkerSettings) -> None:
    for out in (
        zettelq("get", "no-such-note", "--debug"),
        zettelq("--debug", "get", "no-such-note"),
        zettelq("get", "no-such-note", ZQ_DEBUG="1"),
    ):
        assert out.returncode == 1
        assert out.stderr.startswith("Traceback (most recent call last):")
        assert "producer.errors.NotFound" in out.stderr
        assert out.stderr.splitlines()[-1].startswith("zettelq: error: no active note")


def test_ctrl_c_exits_130_quietly(cli_env: WorkerSettings, redis_db: Redis) -> None:
    """A search with no worker to answer waits for its reply; Ctrl-C ends the wait."""
    queue = Keys.of(cli_env).search_queue_of([NS])
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "search", "anything", "-n", NS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ZQ_REPLY_TIMEOUT_S": "30"},
    )
    # its job is queued in the same round trip as the wait for its reply: past start-up, however
    # slow a loaded host makes it
    wait_until(lambda: redis_db.llen(queue) == 1, 30)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert (proc.returncode, out, err) == (130, "", "")


def test_a_reader_that_leaves_ends_it_quietly(cli_env: WorkerSettings) -> None:
    """As ``zettelq dead list | head -0``: stdout is closed before the command writes."""
    command = [sys.executable, "-m", "worker.cli.main", "dead", "list"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        assert proc.wait(timeout=30) == 141
        assert proc.stderr.read() == b""


def test_an_unknown_variable_is_warned_of_once_with_the_closest_name(
    cli_env: WorkerSettings,
) -> None:
    out = zettelq("stats", "-n", NS, ZQ_MAX_KK="3", ZQ_NAMESPACE_KEYS__OTHER="s3cret")
    assert out.returncode == 0
    assert (
        out.stderr
        == "zettelq: warning: ZQ_MAX_KK is not a zettelq setting; did you mean ZQ_MAX_K?\n"
    )


def test_version_comes_from_the_package_metadata() -> None:
    entry_point = Path(sys.executable).with_name("zettelq")
    out = subprocess.run([entry_point, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout == f"zettelq {version('zettelq')}\n"


def test_plain_commands_print_no_library_noise_and_load_no_faiss(
    cli_env: WorkerSettings,
) -> None:
    out = zettelq("dead", "list")
    assert (out.returncode, out.stdout, out.stderr) == (0, "no dead letters\n", "")
    for command in (["stats"], ["dead", "list"]):
        probe = (
            f"import sys; from worker.cli.main import main; main({command!r})\n"
            "print(sorted(m for m in sys.modules if m in ('faiss', 'numpy', 'celery')))"
        )
        run = [sys.executable, "-c", probe]
        out = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
        assert out.stdout.splitlines()[-1] == "[]" and out.stderr == "", command


@pytest.fixture
def stored(cli_env: WorkerSettings, client: MemoryClient, ctx: WorkerContext) -> dict[str, str]:
    texts = {
        "auth": "Login uses OAuth with key-pair authentication for the Snowflake warehouse.",
        "warehouse": "The Snowflake warehouse stores billing events; key-pair login only.",
        "lunch": "The team lunch moved to Friday.",
    }
    ids = dict(zip(texts, client.store_many(list(texts.values()), namespace=NS), strict=True))
    drain_all(ctx)
    return ids


def test_search_and_dead_print_json_lines_that_parse(
    stored: dict[str, str], server: SearchServer
) -> None:
    out = zettelq("search", "Snowflake key-pair", "-n", NS, "--json")
    hits = [json.loads(line) for line in out.stdout.splitlines()]
    assert {h["id"] for h in hits} >= {stored["auth"], stored["warehouse"]}
    assert all(h["created_at"].endswith("Z") for h in hits)  # ISO 8601, UTC
    assert zettelq("dead", "list", "--json").stdout == ""  # none: no lines
    table = zettelq("search", "Snowflake key-pair", "-n", NS).stdout
    assert "score" in table and stored["auth"] in table
    assert zettelq("search", "Snowflake", "-n", "nothing-here").stdout == "no matches\n"
    floor = zettelq("search", "lunch on Friday", "-n", NS, "--min-relevance", "0.9", "--json")
    assert [json.loads(line)["id"] for line in floor.stdout.splitlines()] == [stored["lunch"]]


def test_get_prints_a_readable_note_with_iso_times(stored: dict[str, str]) -> None:
    note = json.loads(zettelq("get", stored["lunch"], "-n", NS, "--json").stdout)
    assert note["content"] == "The team lunch moved to Friday."
    assert note["created_at"].startswith(time.strftime("%Y-", time.gmtime()))
    table = zettelq("get", stored["lunch"], "-n", NS).stdout
    assert "The team lunch moved to Friday." in table and "created_at" in table


def test_context_connected_and_delete(
    stored: dict[str, str], server: SearchServer, ctx: WorkerContext, client: MemoryClient
) -> None:
    text = zettelq("context", "Snowflake key-pair", "-n", NS, "--max-tokens", "200").stdout
    assert "key-pair" in text
    out = zettelq("connected", stored["auth"], "-n", NS, "--hops", "1", "--json")
    linked = [json.loads(line) for line in out.stdout.splitlines()]
    assert stored["warehouse"] in [n["id"] for n in linked]
    assert all(n["hop"] == 1 and n["via"] == stored["auth"] for n in linked)
    table = zettelq("connected", stored["auth"], "-n", NS).stdout
    assert stored["warehouse"] in table  # ids are never cut short
    alone = client.store("A note with no company at all.", namespace="alone")
    drain_all(ctx)
    assert zettelq("connected", alone, "-n", "alone").stdout == "no linked notes\n"
    assert_one_error_line(zettelq("connected", "no-such-note", "-n", NS), 1)

    out = zettelq("delete", stored["lunch"], "-n", NS)
    assert out.stdout == f"queued the deletion of {stored['lunch']} in namespace {NS}\n"
    drain_all(ctx)
    assert_one_error_line(zettelq("get", stored["lunch"], "-n", NS), 1)
    assert client.stats(NS).notes == 2


@pytest.fixture(scope="session")
def base_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding zettelq as ``pip install zettelq`` leaves it: no extras (so no celery,
    numpy or faiss). Built once per session with this venv's pip (its cache makes it quick)."""
    venv = tmp_path_factory.mktemp("base-install") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "-e", ROOT]
    built = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        last = (built.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"cannot build a base install of zettelq with pip: {last}")
    return python


def test_a_missing_extra_says_which_to_install(base_install: Path, cli_env: WorkerSettings) -> None:
    assert zettelq("stats", "-n", NS, python=str(base_install)).returncode == 0
    for command, extra in (("worker", "worker"), ("runs", "worker")):
        message = assert_one_error_line(zettelq(command, python=str(base_install)), 1)
        assert (
            message
            == f"'zettelq {command}' needs the {extra} extra: pip install 'zettelq[{extra}]'"
        )
    no_celery = [base_install, "-c", "import celery"]
    assert subprocess.run(no_celery, capture_output=True).returncode == 1  # really absent
