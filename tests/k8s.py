"""deploy/k8s/ as the tests read it: its objects, a container's environment, and the KEDA
ScaledObject's formula evaluated the way KEDA does (sum of per-trigger metric values), for the
subset of expr-lang the manifest uses: names, numbers, +, * and min()."""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"


def manifests() -> dict[Path, list[dict[str, Any]]]:
    """Every YAML file under deploy/k8s/ and the objects in it."""
    return {
        path: [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        for path in sorted(K8S.rglob("*.yaml"))
    }


def objects(kind: str | None = None) -> list[dict[str, Any]]:
    found = [obj for docs in manifests().values() for obj in docs]
    return [obj for obj in found if kind in (None, obj["kind"])]


def one(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects(kind) if o["metadata"]["name"] == name]
    return obj


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def plain_env(deployment: dict[str, Any]) -> dict[str, str]:
    """The variables a Deployment's container gets with a literal value: its ConfigMaps' data,
    then its own ``env`` entries that have a ``value`` (those from secrets are left out)."""
    spec = container(deployment)
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(one("ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in spec.get("env", []) if "value" in e})
    return env


def formula(scaled_object: dict[str, Any]) -> str:
    return str(scaled_object["spec"]["advanced"]["scalingModifiers"]["formula"])


def names_in(expression: str) -> set[str]:
    """The trigger names ``expression`` reads (not the functions it calls)."""
    tree = ast.parse(expression, mode="eval")
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def evaluate(expression: str, values: Mapping[str, float]) -> float:
    """``expression`` over the trigger values: refuses anything but the subset above."""

    def ev(node: ast.expr) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            return float(values[node.id])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = ev(node.left), ev(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "min"
            and not node.keywords
        ):
            return min(ev(arg) for arg in node.args)
        raise ValueError(f"not in the formula subset: {ast.dump(node)}")

    return ev(ast.parse(expression, mode="eval").body)


def desired_workers(scaled_object: dict[str, Any], values: Mapping[str, float]) -> int:
    """What KEDA asks the HPA for: 0 while the formula is at or below activationTarget (after
    cooldownPeriod), else ceil(formula / target) (metricType AverageValue) within the bounds."""
    spec = scaled_object["spec"]
    modifiers = spec["advanced"]["scalingModifiers"]
    value = evaluate(formula(scaled_object), values)
    if value <= float(modifiers.get("activationTarget", "0")):
        return int(spec["minReplicaCount"])
    wanted = math.ceil(value / float(modifiers["target"]))
    return max(1, min(wanted, int(spec["maxReplicaCount"])))
