#!/usr/bin/env python3
"""Writes the operator's Grafana dashboard and Prometheus rules from one description.

Outputs, all generated (edit this file, then run ``python dashboards/generate.py``):

- ``dashboards/mpijob-operator.json``: the Grafana dashboard, built with the Grafana Foundation
  SDK (so its JSON follows Grafana's dashboard model);
- ``dashboards/rules.yaml``: recording rules and alerts as a Prometheus rule file;
- ``manifests/overlays/monitoring/prometheus-rule.yaml``: the same groups as a Prometheus
  Operator PrometheusRule.

Every expression reads only metrics of :mod:`mpijob.metrics` (and the process collector's
``process_*``), which ``tests/unit/manifests`` checks; ``tests/integration/test_monitoring.py``
runs each one against a real Prometheus scraping the operator. ``--check`` exits 1 when a
committed output differs from what this file generates.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableOption,
    VariableRefresh,
)

ROOT: Final = Path(__file__).resolve().parents[1]
DASHBOARD_PATH: Final = ROOT / "dashboards" / "mpijob-operator.json"
RULES_PATH: Final = ROOT / "dashboards" / "rules.yaml"
PROMETHEUS_RULE_PATH: Final = (
    ROOT / "manifests" / "overlays" / "monitoring" / "prometheus-rule.yaml"
)

#: The scrape job: the metrics Service's name, which is the job label a ServiceMonitor gives.
JOB: Final = "mpijob-operator-metrics"
#: Series selector of the operator's own metrics on the dashboard (its ``job`` variable).
SEL: Final = '{job=~"$job"}'
RATE: Final = "$__rate_interval"
DATASOURCE: Final = DataSourceRef(type_val="prometheus", uid="${datasource}")


def quantiles(metric: str, qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> list[tuple[str, str]]:
    """``histogram_quantile`` of a histogram over the dashboard's rate window, one per q."""
    return [
        (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{SEL}[{RATE}])))",
            f"p{round(q * 100)}",
        )
        for q in qs
    ]


def rate(metric: str, legend: str) -> tuple[str, str]:
    return (f"sum(rate({metric}_total{SEL}[{RATE}]))", legend)


@dataclass(frozen=True)
class Chart:
    """One panel: a title, what it explains, and its (expression, legend) queries."""

    title: str
    description: str
    queries: list[tuple[str, str]]
    unit: str = "short"
    stat: bool = False


ROWS: Final[list[tuple[str, list[Chart]]]] = [
    (
        "Jobs",
        [
            Chart(
                "Jobs created, succeeded and failed",
                "MPIJobs per second, as upstream counts them: created once, succeeded or failed "
                "when the launcher finishes (evictions are not failures).",
                [
                    rate("mpi_operator_jobs_created", "created"),
                    rate("mpi_operator_jobs_successful", "succeeded"),
                    rate("mpi_operator_jobs_failed", "failed"),
                ],
                unit="ops",
            ),
            Chart(
                "Running jobs",
                "MPIJobs whose Running condition is True.",
                [(f"sum(mpi_operator_jobs_running{SEL})", "running")],
            ),
            Chart(
                "Waiting jobs",
                "Jobs held back: waiting for their whole gang, or (topology-aware) for GPUs "
                "that fit them.",
                [
                    (f"sum(mpi_operator_gang_waiting_jobs{SEL})", "gang"),
                    (f"sum(mpi_operator_jobs_waiting_for_gpus{SEL})", "GPUs"),
                ],
            ),
            Chart(
                "Time to Running",
                "From an MPIJob's creation to its Running condition.",
                quantiles("mpi_operator_job_time_to_running_seconds"),
                unit="s",
            ),
            Chart(
                "Job duration",
                "From start to completion, succeeded or failed.",
                quantiles("mpi_operator_job_duration_seconds"),
                unit="s",
            ),
        ],
    ),
    (
        "Failures and start-up",
        [
            Chart(
                "Job failures by reason",
                "Failures per second of MPIJobs and of their workers, by the kubelet's reason "
                "(OOMKilled, Error, Evicted, DeadlineExceeded, ImagePullBackOff, ...), else the "
                "launcher Job's reason: each failure of a worker while its job runs, and each "
                "failed job by its first pod failure unless counted so already. The WorkerFailed "
                "and the job's Failed Warning Events name the pod, container and exit code.",
                [
                    (
                        f"sum by (reason) (rate(mpi_operator_job_failures_total{SEL}[{RATE}]))",
                        "{{reason}}",
                    )
                ],
                unit="ops",
            ),
            Chart(
                "Time to every worker Ready",
                "From an MPIJob's creation until the last of its workers was Ready (image "
                "pulls, scheduling and gang waits included).",
                quantiles("mpi_operator_job_time_to_workers_ready_seconds"),
                unit="s",
            ),
            Chart(
                "Time to launcher running",
                "From an MPIJob's creation until its launcher's container first ran "
                "(WaitForWorkersReady jobs start it only once every worker is Ready).",
                quantiles("mpi_operator_job_time_to_launcher_running_seconds"),
                unit="s",
            ),
            Chart(
                "GPUs held by finished jobs",
                "GPUs requested by Running or Pending workers of MPIJobs that have finished: "
                "cleanPodPolicy None (upstream's default) leaves them, and nothing uses them. "
                "Their jobs carry WorkersLeftRunning=True; --default-clean-pod-policy=Running "
                "frees them for jobs that set no policy.",
                [(f"sum(mpi_operator_finished_jobs_gpus_held{SEL})", "GPUs")],
            ),
        ],
    ),
    (
        "Placement and gang",
        [
            Chart(
                "Placement ring bandwidth",
                "Ring bottleneck bandwidth of each topology-placed job, GB/s per direction: "
                "higher is better (NVLink rings reach 25-150, PCIe and cross-node rings 12).",
                [
                    *quantiles("mpi_operator_placement_ring_bandwidth_gbps", (0.1, 0.5)),
                    (
                        f"sum(rate(mpi_operator_placement_ring_bandwidth_gbps_sum{SEL}[{RATE}]))"
                        f" / sum(rate(mpi_operator_placement_ring_bandwidth_gbps_count{SEL}"
                        f"[{RATE}]))",
                        "mean",
                    ),
                ],
                unit="GBs",
            ),
            Chart(
                "Placements not honoured",
                "Placed worker pods whose containers hold other GPUs than were chosen for them, "
                "as the node agent reads them from the kubelet, by --gpu-binding mode (nonzero "
                "under annotations: the device plugin picked other GPUs), and, under dra, jobs "
                "placed anew because a pinned GPU was taken before its claim was allocated.",
                [
                    (
                        "sum by (binding) (increase("
                        f"mpi_operator_placements_not_honoured_total{SEL}[{RATE}]))",
                        "{{binding}}",
                    )
                ],
            ),
            Chart(
                "Placement decision latency",
                "Time to choose the node and GPUs of every worker of one job.",
                quantiles("mpi_operator_placement_decision_seconds"),
                unit="s",
            ),
            Chart(
                "Admission pass time",
                "One pass of the topology queue over every waiting job: placing each, or saying "
                "why it waits.",
                quantiles("mpi_operator_admission_pass_seconds"),
                unit="s",
            ),
            Chart(
                "Gang wait",
                "From an MPIJob's creation to all of its pods bound to nodes.",
                quantiles("mpi_operator_gang_bind_seconds"),
                unit="s",
            ),
            Chart(
                "Gang timeouts",
                "Jobs failed because their gang was not admitted within scheduleTimeoutSeconds.",
                [(f"sum(increase(mpi_operator_gang_timeouts_total{SEL}[{RATE}]))", "timeouts")],
            ),
        ],
    ),
    (
        "GPU shares",
        [
            Chart(
                "GPU shares held",
                "Shares of one GPU the ledger holds (with --fractional-gpus: admitted pods and "
                "workers reserved for their MPIJob), pods waiting behind the scheduling gate for "
                "room, and the most MPS clients on any one GPU (MPS allows 48).",
                [
                    (f"sum(mpi_operator_gpu_shares{SEL})", "shares"),
                    (
                        f"sum(mpi_operator_gpu_share_waiting_pods{SEL}) or on() vector(0)",
                        "pods waiting",
                    ),
                    (
                        f"max(mpi_operator_gpu_share_clients{SEL}) or on() vector(0)",
                        "most clients on one GPU",
                    ),
                ],
            ),
            Chart(
                "GPU compute held",
                "Percent of each core_mem GPU's compute held by shares (100 at most); 0 "
                "without --fractional-gpus.",
                [
                    (
                        f"max by (node, gpu) (mpi_operator_gpu_share_percentage{SEL})"
                        " or on() vector(0)",
                        "{{node}} GPU{{gpu}}",
                    )
                ],
                unit="percent",
            ),
            Chart(
                "GPU memory held",
                "GiB of each core_mem GPU's memory held by shares; 0 without --fractional-gpus.",
                [
                    (
                        f"max by (node, gpu) (mpi_operator_gpu_share_memory_gib{SEL})"
                        " or on() vector(0)",
                        "{{node}} GPU{{gpu}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Operator",
        [
            Chart(
                "Reconcile errors",
                "Reconciles that failed and were re-queued with backoff, per second.",
                [rate("mpi_operator_reconcile_errors", "errors")],
                unit="ops",
            ),
            Chart(
                "Reconcile duration",
                "One reconcile of one MPIJob, from dequeue to status written.",
                quantiles("mpi_operator_reconcile_duration_seconds"),
                unit="s",
            ),
            Chart(
                "Work queue depth",
                "MPIJob keys waiting to be reconciled.",
                [(f"sum(mpi_operator_workqueue_depth{SEL})", "depth")],
            ),
            Chart(
                "Events dropped",
                "Events not sent because 1,000 were waiting already: jobs come faster than "
                "--kube-api-qps leaves room for their Events. Per second.",
                [rate("mpi_operator_events_dropped", "dropped")],
                unit="ops",
            ),
            Chart(
                "API requests by verb",
                "Requests the operator sends to the Kubernetes API server, per second.",
                [
                    (
                        f"sum by (verb) (rate(mpi_operator_api_requests_total{SEL}[{RATE}]))",
                        "{{verb}}",
                    )
                ],
                unit="reqps",
            ),
            Chart(
                "Operator memory",
                "Resident memory of each operator process.",
                [(f"process_resident_memory_bytes{SEL}", "{{instance}}")],
                unit="bytes",
            ),
            Chart(
                "Leader",
                "1 when a replica holds the leader Lease.",
                [(f"max(mpi_operator_is_leader{SEL})", "leader")],
                stat=True,
            ),
        ],
    ),
]


def _panel(chart: Chart, panel_id: int) -> Any:
    panel: Any = stat.Panel() if chart.stat else timeseries.Panel()
    panel = (
        panel.id(panel_id)
        .title(chart.title)
        .description(chart.description)
        .datasource(DATASOURCE)
        .unit(chart.unit)
        .height(8)
        .span(8)
    )
    if chart.stat:
        panel = panel.graph_mode(common.BigValueGraphMode.AREA).color_mode(
            common.BigValueColorMode.VALUE
        )
    else:
        panel = panel.legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        ).fill_opacity(10)
    for index, (expr, legend) in enumerate(chart.queries):
        panel = panel.with_target(
            prometheus.Dataquery()
            .expr(expr)
            .legend_format(legend)
            .ref_id(chr(ord("A") + index))
            .datasource(DATASOURCE)
        )
    return panel


def build_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    board = (
        dashboard.Dashboard("MPIJob operator")
        .uid("mpijob-operator")
        .description("kubeflow.org/v2beta1 MPIJobs: jobs, placement, gang admission, operator")
        .tags(["mpijob", "kubeflow", "mpi-operator"])
        .timezone("browser")
        .time("now-6h", "now")
        .refresh("30s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("job")
            .label("Job")
            .datasource(DATASOURCE)
            .query("label_values(mpi_operator_is_leader, job)")
            .current(VariableOption(selected=True, text=JOB, value=JOB))
            .include_all(True)
            .all_value(".+")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
    )
    # Grafana links, shares and embeds panels by id: fixed ids keep those links stable.
    panel_id = 0
    for title, charts in ROWS:
        panel_id += 1
        board = board.with_row(dashboard.Row(title).id(panel_id))
        for chart in charts:
            panel_id += 1
            board = board.with_panel(_panel(chart, panel_id))
    built: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return built


def expressions(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels (variables left in)."""
    return [
        target["expr"]
        for panel in board.get("panels", [])
        for target in panel.get("targets", [])
        if "expr" in target
    ]


# --- Prometheus rules ---------------------------------------------------------------------------

UP: Final = f'up{{job="{JOB}"}}'
RECORDING: Final = [
    ("mpijob:jobs_created:rate5m", "sum(rate(mpi_operator_jobs_created_total[5m]))"),
    ("mpijob:jobs_succeeded:rate5m", "sum(rate(mpi_operator_jobs_successful_total[5m]))"),
    ("mpijob:jobs_failed:rate5m", "sum(rate(mpi_operator_jobs_failed_total[5m]))"),
    (
        "mpijob:job_time_to_running_seconds:p90_5m",
        "histogram_quantile(0.9, sum by (le) "
        "(rate(mpi_operator_job_time_to_running_seconds_bucket[5m])))",
    ),
    (
        "mpijob:gang_bind_seconds:p90_5m",
        "histogram_quantile(0.9, sum by (le) (rate(mpi_operator_gang_bind_seconds_bucket[5m])))",
    ),
    (
        "mpijob:reconcile_duration_seconds:p99_5m",
        "histogram_quantile(0.99, sum by (le) "
        "(rate(mpi_operator_reconcile_duration_seconds_bucket[5m])))",
    ),
    ("mpijob:reconcile_errors:rate5m", "sum(rate(mpi_operator_reconcile_errors_total[5m]))"),
]


@dataclass(frozen=True)
class Alert:
    """An alert, and the part of its expression that has data whether or not it fires."""

    name: str
    signal: str
    """What the alert watches; present in ``expr``, and tested to return data."""
    condition: str
    """Appended to the signal: the alert fires while ``signal condition`` returns samples."""
    for_: str
    severity: str
    summary: str
    or_absent: str | None = None
    """A series whose absence also fires the alert (nothing left to scrape)."""

    @property
    def expr(self) -> str:
        expr = f"{self.signal} {self.condition}"
        return f"{expr} or absent({self.or_absent})" if self.or_absent else expr


ALERTS: Final = [
    Alert(
        "MPIJobOperatorDown",
        f"sum({UP})",
        "== 0",
        "5m",
        "critical",
        "No mpijob-operator replica has been scraped for 5 minutes: MPIJobs are not reconciled.",
        or_absent=UP,
    ),
    Alert(
        "MPIJobOperatorNoLeader",
        "max(mpi_operator_is_leader)",
        "== 0",
        "5m",
        "critical",
        "No mpijob-operator replica holds the leader Lease: MPIJobs are not reconciled.",
    ),
    Alert(
        "MPIJobGangWaitingTooLong",
        "max(mpi_operator_gang_waiting_jobs)",
        "> 0",
        "15m",
        "warning",
        "MPIJobs have waited more than 15 minutes for their whole gang to fit.",
    ),
    Alert(
        "MPIJobWaitingForGpus",
        "max(mpi_operator_jobs_waiting_for_gpus)",
        "> 0",
        "30m",
        "warning",
        "Topology-placed MPIJobs have found no GPUs that fit them for 30 minutes.",
    ),
    Alert(
        "MPIJobFinishedJobsHoldGpus",
        "max(mpi_operator_finished_jobs_gpus_held)",
        "> 0",
        "30m",
        "warning",
        "Workers of finished MPIJobs have held GPUs for 30 minutes (cleanPodPolicy None): the "
        "jobs with WorkersLeftRunning=True name them; delete them, or set cleanPodPolicy "
        "Running (per job, or --default-clean-pod-policy).",
    ),
    Alert(
        "MPIJobReconcileErrors",
        "sum(rate(mpi_operator_reconcile_errors_total[5m]))",
        "> 0.1",
        "10m",
        "warning",
        "mpijob-operator reconciles keep failing (more than one every 10 seconds).",
    ),
    Alert(
        "MPIJobReconcileSlow",
        "histogram_quantile(0.99, sum by (le) "
        "(rate(mpi_operator_reconcile_duration_seconds_bucket[5m])))",
        "> 5",
        "15m",
        "warning",
        "The slowest 1% of MPIJob reconciles take more than 5 seconds.",
    ),
    Alert(
        "MPIJobWorkQueueBacklog",
        "max(mpi_operator_workqueue_depth)",
        "> 100",
        "10m",
        "warning",
        "More than 100 MPIJobs have been waiting to be reconciled for 10 minutes.",
    ),
]


def build_rules() -> dict[str, Any]:
    """The rule file: one group of recording rules, one of alerts."""
    return {
        "groups": [
            {
                "name": "mpijob-operator.rules",
                "rules": [{"record": name, "expr": expr} for name, expr in RECORDING],
            },
            {
                "name": "mpijob-operator.alerts",
                "rules": [
                    {
                        "alert": alert.name,
                        "expr": alert.expr,
                        "for": alert.for_,
                        "labels": {"severity": alert.severity},
                        "annotations": {"summary": alert.summary},
                    }
                    for alert in ALERTS
                ],
            },
        ]
    }


def build_prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "mpijob-operator",
            "labels": {
                "app.kubernetes.io/name": "mpijob-operator",
                "app.kubernetes.io/component": "operator",
            },
        },
        "spec": rules,
    }


HEADER: Final = "# Generated by dashboards/generate.py; edit that file, not this one.\n"


def outputs() -> dict[Path, str]:
    """Each generated file and its text."""
    rules = build_rules()
    return {
        DASHBOARD_PATH: json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n",
        RULES_PATH: HEADER + yaml.safe_dump(rules, sort_keys=False, width=100),
        PROMETHEUS_RULE_PATH: HEADER
        + yaml.safe_dump(build_prometheus_rule(rules), sort_keys=False, width=100),
    }


def main(argv: list[str]) -> int:
    stale = []
    for path, text in outputs().items():
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path.relative_to(ROOT))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{path} is stale: run python dashboards/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
