"""The Grafana dashboard and the Prometheus rules: generated, schema-true, on real metrics."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_client import REGISTRY
from promql_names import metric_names

import mpijob.metrics  # noqa: F401 - registers the operator's metrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
BOARD = json.loads((ROOT / "dashboards" / "mpijob-operator.json").read_text())
RULES = yaml.safe_load((ROOT / "dashboards" / "rules.yaml").read_text())


#: dashboards/generate.py is a script, not a module of a package: run it for its names.
generate = SimpleNamespace(**runpy.run_path(str(ROOT / "dashboards" / "generate.py")))

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def exported_series() -> set[str]:
    """Every series name the operator's registry can export (labelled children included)."""
    names = set()
    for family in REGISTRY.collect():
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def recorded() -> set[str]:
    return {r["record"] for g in RULES["groups"] for r in g["rules"] if "record" in r}


def rule_expressions() -> list[str]:
    return [r["expr"] for g in RULES["groups"] for r in g["rules"]]


def test_generated_files_are_up_to_date() -> None:
    """The committed JSON and YAML are exactly what dashboards/generate.py writes."""
    stale = [
        str(path.relative_to(ROOT))
        for path, text in generate.outputs().items()
        if path.read_text() != text
    ]
    assert stale == [], "run: python dashboards/generate.py"


def test_dashboard_round_trips_through_grafanas_dashboard_model() -> None:
    """Decoding into the Foundation SDK's models (generated from Grafana's schema) and encoding
    again loses nothing: no field the model does not know, none of the wrong shape."""
    register_default_plugins()
    model = Dashboard.from_json(BOARD)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert again == BOARD


def test_a_field_unknown_to_the_model_does_not_survive_the_round_trip() -> None:
    """The round trip is a real check: an invented panel field is dropped by the model."""
    register_default_plugins()
    tampered = json.loads(json.dumps(BOARD))
    tampered["panels"][1]["colour"] = "red"
    tampered["panels"][1]["targets"][0]["promql"] = "up"
    again = json.loads(json.dumps(Dashboard.from_json(tampered), cls=JSONEncoder))
    assert again != tampered
    assert "colour" not in again["panels"][1]


def test_every_panel_has_a_unique_id_a_title_and_queries() -> None:
    panels = BOARD["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["description"], panel["title"]
            assert [t["refId"] for t in panel["targets"]] == [
                chr(ord("A") + i) for i in range(len(panel["targets"]))
            ]


def test_the_dashboard_covers_what_operators_watch() -> None:
    titles = {p["title"] for p in BOARD["panels"]}
    assert titles >= {
        "Jobs created, succeeded and failed",
        "Running jobs",
        "Waiting jobs",
        "Time to Running",
        "Job duration",
        "Placement ring bandwidth",
        "Placement decision latency",
        "Gang wait",
        "Reconcile errors",
        "Reconcile duration",
        "Work queue depth",
        "API requests by verb",
        "Operator memory",
    }


def test_every_expression_reads_only_metrics_the_operator_exports() -> None:
    known = exported_series() | {"up"} | recorded()
    expressions = generate.expressions(BOARD) + rule_expressions()
    unknown = {e: sorted(metric_names(e) - known) for e in expressions if metric_names(e) - known}
    assert unknown == {}
    read = set().union(*(metric_names(e) for e in expressions))
    assert all(name.startswith(("mpi_operator_", "process_", "up")) for name in read)


def test_every_operator_metric_is_on_the_dashboard() -> None:
    """No metric goes unwatched (job_info is per job, for joins; _created series are not read)."""
    read = set().union(*(metric_names(e) for e in generate.expressions(BOARD)))
    families = {f.name for f in REGISTRY.collect() if f.name.startswith("mpi_operator_")} - {
        "mpi_operator_job_info"
    }
    missing = {f for f in families if not any(name.startswith(f) for name in read)}
    assert missing == set()


def test_the_metric_name_scanner() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{job=~"x|y"}[5m] offset 1m))) '
        "/ on (job) group_left (instance) b_total > bool 2 or absent(up)"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "up"}


def test_alerts_fire_on_their_signal_and_say_why() -> None:
    by_name = {a.name: a for a in generate.ALERTS}
    alerts = [r for g in RULES["groups"] for r in g["rules"] if "alert" in r]
    assert [a["alert"] for a in alerts] == list(by_name)
    for rule in alerts:
        alert = by_name[rule["alert"]]
        assert alert.signal in rule["expr"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"].endswith(".")
    gang = by_name["MPIJobGangWaitingTooLong"]
    assert (gang.expr, gang.for_) == ("max(mpi_operator_gang_waiting_jobs) > 0", "15m")
    down = by_name["MPIJobOperatorDown"].expr
    assert down.endswith('or absent(up{job="mpijob-operator-metrics"})')


def test_prometheus_rule_carries_the_same_groups() -> None:
    path = ROOT / "manifests" / "overlays" / "monitoring" / "prometheus-rule.yaml"
    rule: dict[str, Any] = yaml.safe_load(path.read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"] == RULES
