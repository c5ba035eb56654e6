"""deploy/prometheus/alerts.yml and deploy/grafana/zettelq.json name only series zettelq
exports: every ``zettelq_*`` name in them is a metric the worker defines or the Redis gauges a
scrape reads (checked against prometheus-client's registry and a real Redis)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from worker import metrics
from worker.settings import WorkerSettings

prometheus_client = pytest.importorskip(
    "prometheus_client", reason="pip install -e '.[metrics]' to run this"
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = re.compile(r"\bzettelq_[a-z_]+")


def exported(settings: WorkerSettings) -> set[str]:
    """Every series name: the worker's metrics and the Redis collector's gauges."""
    assert metrics._metrics() is not None
    families = [*prometheus_client.REGISTRY.collect(), *metrics.RedisCollector(settings).collect()]
    names = set()
    for family in families:
        names.add(family.name)
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            names.add(family.name + suffix)
    return {n for n in names if n.startswith("zettelq_")}


def test_alert_rules_and_dashboard_use_exported_series(settings: WorkerSettings) -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((DEPLOY / "grafana" / "zettelq.json").read_text())
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in NAME.findall(expr)}
    assert len(used) >= 10
    assert used <= exported(settings), sorted(used - exported(settings))
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert {"ZettelqBacklogGrowing", "ZettelqDeadLetters", "ZettelqNoLiveWorker"} <= alerts
