"""deploy/k8s/ read as files: every core object validates offline against the Kubernetes schemas
bundled in kubernetes-validate, the KEDA objects against KEDA's CRDs (cloudcoil's generated
models), labels and selectors agree, beat runs once and the searchers never go below one, probes
read the heartbeat, the grace period outlasts the soft shutdown, the KEDA field names and
scaler metadata keys are the ones KEDA reads, and every ZQ_ variable is a real setting."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from producer.keys import Keys
from tests.k8s import (
    K8S,
    container,
    desired_workers,
    evaluate,
    formula,
    manifests,
    names_in,
    objects,
    one,
    plain_env,
)
from worker.settings import WorkerSettings

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install -e '.[dev]' (kubernetes-validate) to run this"
)
keda = pytest.importorskip(
    "cloudcoil.models.keda.v1alpha1", reason="pip install -e '.[dev]' (cloudcoil-models-keda)"
)

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
LABELS = ("name", "instance", "version", "component", "part-of", "managed-by")
SELECTOR = ("name", "instance", "component")
KEDA_API = "keda.sh/v1alpha1"
#: Kubernetes releases the core objects are checked against: the oldest and newest bundled
K8S_VERSIONS = ("1.25.0", "1.37.0")
#: the ScaledObject and trigger fields KEDA reads (INTERFACES.md §5.1; keda@8b4f083
#: apis/keda/v1alpha1/scaledobject_types.go)
SCALED_OBJECT_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
TRIGGER = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
MODIFIERS = {"formula", "target", "activationTarget", "metricType"}
#: scaler metadata keys (pkg/scalers/redis_streams_scaler.go, redis_scaler.go): with no
#: consumerGroup the redis-streams scaler reads XLEN; consumerGroup alone would read XPENDING
STREAMS_METADATA = {"stream", "streamLength", "databaseIndex"}
LIST_METADATA = {"listName", "listLength", "databaseIndex"}
CORE_KINDS = {"ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget"}
HEARTBEAT_ROLES = {"worker", "searcher", "beat"}


def deployments() -> dict[str, dict[str, Any]]:
    return {
        d["spec"]["template"]["metadata"]["labels"][label("component")]: d
        for d in objects("Deployment")
    }


def label(key: str) -> str:
    return f"app.kubernetes.io/{key}"


def scaled_object() -> dict[str, Any]:
    (only,) = objects("ScaledObject")
    return only


def settings_env() -> dict[str, str]:
    return dict(one("ConfigMap", "zettelq")["data"])


def test_every_file_holds_known_kinds_and_keda_lives_apart() -> None:
    files = manifests()
    assert {p.relative_to(K8S).as_posix() for p in files} == {
        "config.yaml",
        "worker.yaml",
        "searcher.yaml",
        "beat.yaml",
        "server.yaml",
        "mcp.yaml",
        "metrics.yaml",
        "keda/worker-autoscaling.yaml",
    }
    for path, docs in files.items():
        keda_file = path.parent.name == "keda"
        for obj in docs:
            assert (obj["apiVersion"] == KEDA_API) == keda_file, (path, obj["kind"])
            assert obj["kind"] in (
                CORE_KINDS if not keda_file else {"ScaledObject", "TriggerAuthentication"}
            )


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_validate_offline_against_the_bundled_schemas(version: str) -> None:
    checked = 0
    for obj in objects():
        if obj["apiVersion"] == KEDA_API:
            continue
        kubernetes_validate.validate(obj, version, strict=True)  # raises ValidationError
        checked += 1
    assert checked == 12


def test_keda_objects_are_known_to_kedas_crds() -> None:
    """cloudcoil's models of the ScaledObject and TriggerAuthentication CRDs type every field and
    ignore unknown ones, so a field they do not know is one their round trip drops."""
    for obj in objects():
        if obj["apiVersion"] != KEDA_API:
            continue
        model = getattr(keda, obj["kind"]).model_validate(obj)
        assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == obj


def test_every_object_carries_the_standard_labels() -> None:
    for obj in objects():
        labels = obj["metadata"]["labels"]
        assert set(labels) == {label(k) for k in LABELS}, obj["metadata"]["name"]
        assert labels[label("name")] == labels[label("part-of")] == "zettelq"
        assert labels[label("instance")] == "zettelq"
        assert labels[label("version")] == VERSION
        assert labels[label("managed-by")] == "kubectl"


def test_each_deployment_selects_its_own_pods_and_services_select_one_deployment() -> None:
    by_component = deployments()
    assert set(by_component) == {"worker", "searcher", "beat", "server", "mcp"}
    for component, dep in by_component.items():
        selector = dep["spec"]["selector"]["matchLabels"]
        template = dep["spec"]["template"]["metadata"]["labels"]
        assert set(selector) == {label(k) for k in SELECTOR}
        assert template == dep["metadata"]["labels"]
        assert template[label("component")] == component
        others = [d for c, d in by_component.items() if c != component]
        for other in others:
            other_labels = other["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= other_labels.items(), (component, other)
    for obj in objects("Service") + objects("PodDisruptionBudget"):
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        matched = [
            d
            for d in by_component.values()
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matched) == 1, obj["metadata"]["name"]
        ports = {p["name"] for p in container(matched[0]).get("ports", [])}
        for port in obj["spec"].get("ports", []):
            assert port["targetPort"] in ports, obj["metadata"]["name"]


def test_beat_runs_once_and_nothing_scales_it() -> None:
    beat = deployments()["beat"]
    assert beat["spec"]["replicas"] == 1
    assert container(beat)["command"][:2] == ["zettelq", "beat"]
    targets = {so["spec"]["scaleTargetRef"]["name"] for so in objects("ScaledObject")}
    assert beat["metadata"]["name"] not in targets
    assert not objects("HorizontalPodAutoscaler")


def test_searchers_never_go_below_one() -> None:
    searcher = deployments()["searcher"]
    assert searcher["spec"]["replicas"] >= 1
    assert container(searcher)["command"] == ["zettelq", "searcher"]
    targets = {so["spec"]["scaleTargetRef"]["name"] for so in objects("ScaledObject")}
    assert searcher["metadata"]["name"] not in targets
    (budget,) = objects("PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] >= 1


def test_the_workers_only_ingest_and_their_grace_outlasts_the_soft_shutdown() -> None:
    worker = deployments()["worker"]
    assert "replicas" not in worker["spec"], "the autoscaler owns it; apply must not reset it"
    assert container(worker)["command"][:2] == ["zettelq", "worker"]
    env = plain_env(worker)
    assert env["ZQ_SERVE_SEARCH"] == "false"
    assert env["REMAP_SIGTERM"] == "SIGQUIT", "SIGTERM starts the soft (bounded) shutdown"
    soft = WorkerSettings(soft_shutdown_s=env["ZQ_SOFT_SHUTDOWN_S"]).soft_shutdown_s
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert 0 < soft and grace >= soft + 15, "time for the cancel and the exit after it"
    for dep in deployments().values():
        assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30


def test_probes_read_the_heartbeat_or_the_http_health_route() -> None:
    for component, dep in deployments().items():
        spec = container(dep)
        probes = {k: v for k, v in spec.items() if k.endswith("Probe")}
        assert "livenessProbe" in probes, component
        text = repr(probes)
        assert "celery" not in text and "inspect" not in text
        if component in HEARTBEAT_ROLES:
            assert set(probes) == {"startupProbe", "livenessProbe"}
            for probe in probes.values():
                assert probe["exec"]["command"] == [
                    "sh",
                    "-c",
                    f'exec zettelq health --role {component} --host "$HOSTNAME"',
                ]
                assert probe["timeoutSeconds"] >= 5, "one check costs about a second of CPU"
        else:
            ports = {p["name"] for p in spec["ports"]}
            for probe in probes.values():
                assert probe["httpGet"]["path"] == "/health"
                assert probe["httpGet"]["port"] in ports


def test_every_zq_variable_is_a_setting_and_its_value_parses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = WorkerSettings.variable_names()
    for dep in deployments().values():
        env = plain_env(dep)
        names = set(env) | {e["name"] for e in container(dep).get("env", [])}
        assert {n for n in names if n.startswith("ZQ_")} <= known, dep["metadata"]["name"]
        assert {n for n in names if not n.startswith("ZQ_")} <= {"REMAP_SIGTERM"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        WorkerSettings()  # raises InvalidSetting on a bad value
        for name in env:
            monkeypatch.delenv(name)
    assert set(settings_env()) <= known


def test_every_pod_reads_redis_from_the_secret() -> None:
    secret = one("Secret", "zettelq-redis")["stringData"]
    for dep in deployments().values():
        refs = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in container(dep).get("env", [])
            if "valueFrom" in e
        }
        assert refs["ZQ_REDIS_URL"] == {"name": "zettelq-redis", "key": "url"}
        for name, ref in refs.items():
            assert ref["name"] == "zettelq-redis"
            assert ref["key"] in secret or ref.get("optional") is True, name
        assert container(dep)["envFrom"] == [{"configMapRef": {"name": "zettelq"}}]


def test_the_scaled_object_pins_kedas_field_names() -> None:
    so = scaled_object()
    assert so["apiVersion"] == KEDA_API
    spec = so["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployments()["worker"]["metadata"]["name"],
    }
    assert spec["minReplicaCount"] == 0, "scale to zero: the searchers answer meanwhile"
    assert spec["maxReplicaCount"] == int(settings_env()["ZQ_SHARD_COUNT"])
    assert set(spec["advanced"]) == {"scalingModifiers"}
    assert set(spec["advanced"]["scalingModifiers"]) == MODIFIERS
    assert spec["advanced"]["scalingModifiers"]["metricType"] == "AverageValue"
    (auth,) = objects("TriggerAuthentication")
    for trigger in spec["triggers"]:
        assert set(trigger) == {"type", "name", "metadata", "authenticationRef"}
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
        assert re.fullmatch(r"[a-z][a-z0-9]*", trigger["name"]), "an expr-lang identifier"
        metadata = trigger["metadata"]
        assert all(isinstance(v, str) for v in metadata.values()), "KEDA metadata are strings"
        if trigger["type"] == "redis-streams":
            assert set(metadata) == STREAMS_METADATA, "no consumerGroup: XLEN, not XPENDING"
        else:
            assert trigger["type"] == "redis"
            assert set(metadata) == LIST_METADATA


def test_one_trigger_per_shard_stream_and_one_for_organise_requests() -> None:
    env = settings_env()
    keys = Keys(env["ZQ_KEY_PREFIX"], int(env["ZQ_SHARD_COUNT"]))
    triggers = scaled_object()["spec"]["triggers"]
    streams = {t["name"]: t["metadata"]["stream"] for t in triggers if t["type"] == "redis-streams"}
    assert streams == {f"shard{n}": keys.inbox(n) for n in range(keys.shard_count)}
    lists = {t["name"]: t["metadata"]["listName"] for t in triggers if t["type"] == "redis"}
    assert lists == {"organise": keys.organise_queue()}
    assert names_in(formula(scaled_object())) == {t["name"] for t in triggers}


def test_the_trigger_authentication_reads_the_same_redis_as_the_pods() -> None:
    (auth,) = objects("TriggerAuthentication")
    secret = one("Secret", "zettelq-redis")["stringData"]
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"address", "password"}
    assert {r["name"] for r in refs.values()} == {"zettelq-redis"}
    assert {set(r) == {"parameter", "name", "key"} for r in refs.values()} == {True}
    url = urlsplit(secret["url"])
    assert secret[refs["address"]["key"]] == f"{url.hostname}:{url.port}"
    assert secret[refs["password"]["key"]] == url.password
    databases = {t["metadata"]["databaseIndex"] for t in scaled_object()["spec"]["triggers"]}
    assert databases == {url.path.strip("/")}


def test_the_formula_asks_one_worker_per_backlogged_shard_and_none_when_drained() -> None:
    so = scaled_object()
    shards = int(settings_env()["ZQ_SHARD_COUNT"])
    idle = {f"shard{n}": 0.0 for n in range(shards)} | {"organise": 0.0}
    assert evaluate(formula(so), idle) == 0
    assert desired_workers(so, idle) == 0
    assert desired_workers(so, idle | {"shard3": 1}) == 1
    assert desired_workers(so, idle | {"shard3": 50_000}) == 1, "one worker drains a shard"
    assert desired_workers(so, idle | {"shard0": 5_000, "shard5": 5_000}) == 2
    assert desired_workers(so, {k: 10_000.0 for k in idle}) == shards
    assert desired_workers(so, idle | {"organise": 1}) == 1
