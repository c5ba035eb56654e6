"""``zettelq token create|list|revoke`` against the real Redis, and ``zettelq serve`` as a real
process answering /health and an authenticated store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from producer.adapters.tokens import TokenStore
from worker.cli.main import main
from worker.runtime.devserver import free_port
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert main(list(argv)) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_token_create_list_revoke_round_trip(
    cli_env: WorkerSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    [made] = run_json(
        capsys,
        "token",
        "create",
        "--read",
        "a",
        "--read",
        "b",
        "--write",
        "a",
        "--label",
        "bot",
        "--json",
    )
    secret = str(made["secret"])

    with TokenStore.from_settings(cli_env) as tokens:
        grant = tokens.check(secret)
    assert grant is not None and grant.token_id == made["token_id"]
    assert made["read"] == ["a", "b"] and made["write"] == ["a"] and made["label"] == "bot"
    [listed] = run_json(capsys, "token", "list", "--json")
    assert listed == {k: v for k, v in made.items() if k != "secret"}
    assert str(listed["created_at"]).endswith("Z")  # ISO 8601, as every command prints times
    assert secret not in json.dumps(listed)
    [gone] = run_json(capsys, "token", "revoke", str(made["token_id"]), "--json")
    assert gone == {"token_id": made["token_id"]}
    assert run_json(capsys, "token", "list", "--json") == []


def test_token_create_prints_the_secret_once_for_people(
    cli_env: WorkerSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["token", "create", "--write", "*"]) == 0
    out = capsys.readouterr().out

    secret = next(word for word in out.split() if word.startswith("zq_"))
    assert out.count(secret) == 2  # the secret, then the header to send
    assert main(["token", "list"]) == 0
    assert secret not in capsys.readouterr().out


def test_bad_token_commands_are_one_line_errors(
    cli_env: WorkerSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["token", "create"]) == 2
    assert "at least one namespace" in capsys.readouterr().err
    assert main(["token", "create", "--read", "bad{ns}"]) == 2
    assert main(["token", "revoke", "0123456789abcdef"]) == 1
    assert capsys.readouterr().err.strip().endswith("no token '0123456789abcdef'")


def test_zettelq_serve_answers_health_and_a_store(cli_env: WorkerSettings) -> None:
    httpx = pytest.importorskip("httpx", reason="the test talks to the server with httpx")
    pytest.importorskip("uvicorn", reason="zettelq serve needs zettelq[server]")
    with TokenStore.from_settings(cli_env) as tokens:
        secret, _ = tokens.create(write=["s"])
    port = free_port()
    argv = [sys.executable, "-m", "worker.cli.main", "serve", "--port", str(port), "--access-log"]
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            url = f"http://127.0.0.1:{port}"
            health = wait_for_health(httpx, url, proc)
            stored = httpx.post(
                f"{url}/v1/namespaces/s/notes",
                json={"content": "through a real server"},
                headers={"Authorization": f"Bearer {secret}"},
            )
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=10)

    assert health.json() == {"status": "ok"}
    assert stored.status_code == 202 and len(stored.json()["id"]) > 0
    assert b'"POST /v1/namespaces/s/notes HTTP/1.1" 202' in out  # --access-log
    assert secret.encode() not in out


def wait_for_health(httpx, url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            return httpx.get(f"{url}/health", timeout=1.0)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "zettelq serve did not answer in time"
            time.sleep(0.1)


BLOCK_FASTAPI = "import sys; sys.modules['fastapi'] = None; "


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_import_producer_needs_no_web_framework() -> None:
    blocked = python(
        "import sys\n"
        "for name in ('fastapi', 'starlette', 'uvicorn', 'httpx'):\n"
        "    sys.modules[name] = None\n"
        "import producer, producer.adapters.tokens, worker.cli.serve\n"
    )
    loaded = python(
        "import sys, producer, producer.adapters.tokens; "
        "print(sorted({'fastapi', 'starlette', 'uvicorn', 'httpx'} & set(sys.modules)))"
    )

    assert blocked.returncode == 0, blocked.stderr
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr


def test_without_the_extra_the_http_module_and_serve_name_it(cli_env: WorkerSettings) -> None:
    imported = python(BLOCK_FASTAPI + "import producer.adapters.http")
    served = python(BLOCK_FASTAPI + "from worker.cli.main import main; sys.exit(main(['serve']))")

    assert "ModuleNotFoundError" in imported.stderr and "zettelq[server]" in imported.stderr
    assert served.returncode == 1
    assert served.stderr.strip() == (
        "zettelq: error: 'zettelq serve' needs the server extra: pip install 'zettelq[server]'"
    )
