"""deploy/compose.yaml and the Dockerfile, read as files: every service has a healthcheck, the
zettelq ones ask `zettelq health` about their own role and container, nothing waits on a Redis
that is not healthy, and no credential is written into them. (tests/e2e/test_compose.py runs
the healthchecks themselves.)"""

from __future__ import annotations

import re

import pytest

from tests.compose import DEPLOY, environment, healthcheck_argv, services

ZETTELQ_ROLES = {"worker": "worker", "searcher": "searcher", "beat": "beat"}
#: a URL's user:password@ part written out (a ${VARIABLE} is fine)
USERINFO = re.compile(r"://[^/\s@$]*:[^/\s@$]+@")
SECRET_NAME = re.compile(r"PASSWORD|PASS|SECRET|TOKEN|API_KEY|BASIC_AUTH|REQUIREPASS", re.I)


def strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in [str(k), *strings(v)]]
    if isinstance(node, list):
        return [s for item in node for s in strings(item)]
    return [str(node)]


@pytest.mark.parametrize("name", sorted(services()))
def test_every_service_has_a_healthcheck(name: str) -> None:
    check = services()[name]["healthcheck"]

    assert check["test"][0] in ("CMD", "CMD-SHELL")
    assert {"interval", "timeout", "retries"} <= set(check)


@pytest.mark.parametrize(("name", "role"), sorted(ZETTELQ_ROLES.items()))
def test_a_zettelq_service_asks_zettelq_health_about_its_role_in_its_container(
    name: str, role: str
) -> None:
    argv = healthcheck_argv(name, {})

    assert argv == ["sh", "-c", f'zettelq health --role {role} --host "$HOSTNAME"']


@pytest.mark.parametrize("name", sorted(set(services()) - {"redis"}))
def test_every_other_service_waits_for_a_healthy_redis(name: str) -> None:
    assert services()[name]["depends_on"]["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", sorted(services()))
def test_no_service_carries_a_credential(name: str) -> None:
    text = strings(services()[name])

    assert not [s for s in text if USERINFO.search(s)]
    env = services()[name].get("environment") or {}
    literal = {k: v for k, v in env.items() if SECRET_NAME.search(k) and "${" not in str(v)}
    assert literal == {}
    assert not [s for s in text if "requirepass" in s]


def test_flower_and_the_workers_read_the_same_redis_url() -> None:
    shell = {"ZQ_REDIS_URL": "redis://:pw@redis:6379/0"}
    flower = environment("flower", shell)

    for name in ("redis", *ZETTELQ_ROLES):
        assert environment(name, shell)["ZQ_REDIS_URL"] == shell["ZQ_REDIS_URL"]
    assert flower["ZQ_REDIS_URL"] == shell["ZQ_REDIS_URL"]
    assert 'CELERY_BROKER_URL="${ZQ_BROKER_URL:-$ZQ_REDIS_URL}"' in " ".join(
        services()["flower"]["command"]
    ).replace("$$", "$")


def test_without_a_shell_variable_the_stack_uses_its_own_redis_service() -> None:
    assert environment("worker", {})["ZQ_REDIS_URL"] == "redis://redis:6379/0"


def test_the_zettelq_services_read_env_example() -> None:
    for name in ZETTELQ_ROLES:
        assert services()[name]["env_file"] == "env.example"
    assert (DEPLOY / "env.example").is_file()


def test_the_image_installs_the_worker_extra_by_default_and_checks_its_health() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()

    assert re.findall(r"pip install [^\n]*", dockerfile) == [
        'pip install --no-cache-dir ".[${EXTRAS}]" \\'
    ]
    assert re.findall(r"^ARG EXTRAS=.*$", dockerfile, re.MULTILINE) == ["ARG EXTRAS=worker"]
    assert 'CMD zettelq health --host "$HOSTNAME"' in dockerfile
