"""Namespace credentials: per-namespace HMAC keys checked by a real worker, plus the Redis ACL
rules that guard the direct reads (get, connected, stats) HMAC cannot reach.

Two tenants share a Redis and a worker. Each producer holds only its own namespace's key and
connects as its own ACL user. A tenant cannot read the other's notes through search, context,
get, connected or stats, and a store it forges for the other namespace is dead-lettered and
audited there.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import msgpack
import pytest
from redis import Redis
from redis.exceptions import NoPermissionError

from producer import AccessDenied, JobFailed, MemoryClient, Unavailable, signing
from producer.protocol import pack
from tests.conftest import make_settings
from tests.e2e.workers import running, wait_until
from worker.intake.dispatch import PRODUCER_SCRIPTS
from worker.runtime.devserver import EmbeddedRedis
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

KEYS = {"acme": "acme-hmac-key", "globex": "globex-hmac-key"}


def tenant_acl(prefix: str, ns: str) -> list[str]:
    """ACL rules of a tenant user (as in docs/reliability.md): read its namespace, queue jobs, await
    replies, nothing else."""
    return [
        *("on", f">{ns}-pw", "resetkeys", "resetchannels", "-@all", "+@connection"),
        *("+evalsha", "+xadd", "+xlen", "+lpush"),
        *("+hgetall", "+hget", "+zrange", "+zcard"),
        f"%R~{prefix}:{{{ns}}}:*",
        f"%RW~{prefix}:{{s*}}:inbox",
        f"%W~{prefix}:search",
        f"%W~{prefix}:{{s*}}:search",
        f"%W~{prefix}:organise",
        f"(+blpop %RW~{prefix}:reply:*)",  # a selector: reply keys take BLPOP and nothing else
    ]


def _tenant(server: EmbeddedRedis, worker: WorkerSettings, ns: str) -> MemoryClient:
    admin = Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", ns, *tenant_acl(worker.key_prefix, ns))
    admin.close()
    return MemoryClient(
        worker.model_copy(
            update={
                "redis_url": f"redis://{ns}:{ns}-pw@127.0.0.1:{server.port}/0",
                "namespace_keys": {ns: worker.namespace_keys[ns]},
            }
        )
    )


def _forge(mem: MemoryClient, key_of: str) -> None:
    """XADD a store job for acme signed with ``key_of``'s key, as a tenant with inbox access."""
    job = {"v": 1, "op": "store", "id": "forged", "ns": "acme", "content": "forged by globex"}
    job |= {"agent": "globex-agent", "created_at": time.time()}
    job["sig"] = signing.sign(job, ["acme"], {"acme": KEYS[key_of]})
    inbox = mem.keys.inbox(mem.keys.shard_of("acme"))
    with Redis.from_url(mem.settings.redis_url) as tenant:  # the tenant's own ACL user
        tenant.xadd(inbox, {"j": msgpack.packb(job, use_bin_type=True)})


def test_a_tenant_cannot_read_or_write_another_tenants_namespace(tmp_path: Path):
    with EmbeddedRedis(requirepass="admin-pw") as server:
        settings = make_settings(
            tmp_path,
            redis_url=server.url,
            namespace_keys=KEYS,
            require_signatures=True,
        )
        env = {"ZQ_NAMESPACE_KEYS": json.dumps(KEYS), "ZQ_REQUIRE_SIGNATURES": "true"}
        with (
            running(settings, **env),
            _tenant(server, settings, "acme") as acme,
            _tenant(server, settings, "globex") as globex,
        ):
            wait_until(lambda: _scripts_loaded(server))  # by the worker: tenants may not
            secret = acme.store("acme's launch date is the 14th", namespace="acme")
            acme.store("acme's launch needs legal sign-off", namespace="acme")
            globex.store("globex launches in spring", namespace="globex")
            assert [h.id for h in acme.search("launch date", namespace="acme", k=1)] == [secret]
            assert globex.search("launch", namespace="globex", k=5)
            for call in (globex.search, globex.context):
                with pytest.raises(JobFailed, match="not signed with the key of namespace 'acme'"):
                    call("launch date", namespace=["globex", "acme"])
            for read in (globex.get, globex.connected):
                with pytest.raises(AccessDenied):
                    read(secret, namespace="acme")
            with pytest.raises(AccessDenied):
                globex.stats("acme")
            with pytest.raises(JobFailed, match="not signed with the key of namespace 'acme'"):
                globex.organise("acme", timeout_s=60)
            assert "importance" not in acme.stats("acme").jobs
            assert acme.organise("acme", jobs=["importance"], timeout_s=60).work["importance"]
            globex.store("globex writes into acme", namespace="acme", id="unsigned")
            _forge(globex, key_of="globex")
            _forge(acme, key_of="acme")  # the same job with the right key is accepted
            acme.flush("acme")
            assert acme.get("forged", namespace="acme").content == "forged by globex"
            with pytest.raises(KeyError):
                acme.get("unsigned", namespace="acme")
            assert acme.stats("acme").dead == 2
            admin = Redis.from_url(server.url)
            audit = admin.xrange(acme.keys.audit("acme"))
            refused = [e for _, e in audit if e[b"op"] == b"refused-store"]
            assert [e[b"actor"] for e in refused] == [b"unknown", b"globex-agent"]
            dead = admin.xrange(acme.keys.dead())
            assert all(
                b"not signed with the key of namespace 'acme'" in e[b"reason"] for _, e in dead
            )
            admin.close()


def test_a_tenant_can_neither_run_its_own_lua_nor_harm_the_worker_through_a_reply_key(
    tmp_path: Path,
):
    with EmbeddedRedis(requirepass="admin-pw") as server:
        settings = make_settings(tmp_path, redis_url=server.url, namespace_keys=KEYS)
        env = {"ZQ_NAMESPACE_KEYS": json.dumps(KEYS)}
        with (
            running(settings, **env),
            _tenant(server, settings, "acme") as acme,
            _tenant(server, settings, "globex") as globex,
            Redis.from_url(acme.settings.redis_url) as tenant,
            Redis.from_url(server.url) as admin,
        ):
            wait_until(lambda: _scripts_loaded(server))
            for attack in (
                lambda: tenant.eval("while true do end", 0),
                lambda: tenant.script_load("while true do end"),
                lambda: tenant.execute_command("FUNCTION", "LOAD", "#!lua name=x\n"),
            ):
                with pytest.raises(NoPermissionError):
                    attack()
            note = globex.store("globex keeps its own memory", namespace="globex")
            job = acme._core.search_job("search", "acme", query="anything", k=3)
            reply = acme.keys.reply(job.job_id)
            for plant in (lambda: tenant.xadd(reply, {"x": 1}), lambda: tenant.lpush(reply, "x")):
                with pytest.raises(NoPermissionError):  # a tenant cannot create a reply key
                    plant()
            admin.xadd(reply, {"planted": 1})  # were one there anyway
            tenant.lpush(acme.keys.search_queue_of(["acme"]), pack(job))
            wait_until(lambda: admin.llen(acme.keys.search_queue_of(["acme"])) == 0)
            for _ in range(3):  # every search thread the planted key could have reached
                assert [h.id for h in globex.search("own memory", namespace="globex")] == [note]
            admin.script_flush()  # as a Redis restart would: the worker loads them again
            wait_until(lambda: _stored(acme), 10)


def _scripts_loaded(server: EmbeddedRedis) -> bool:
    shas = [hashlib.sha1(s.encode()).hexdigest() for s in PRODUCER_SCRIPTS]
    with Redis.from_url(server.url) as admin:
        return all(admin.script_exists(*shas))


def _stored(mem: MemoryClient) -> bool:
    try:
        mem.store("stored once the worker reloaded the scripts", namespace="acme")
    except Unavailable as exc:
        assert "may not load them" in str(exc)
        return False
    return True
