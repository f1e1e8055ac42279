"""A real Prometheus scrapes the operator while it runs jobs; every query of the dashboard and
every rule then returns data (no empty panel, no rule that cannot evaluate).

Prometheus is Debian's ``prometheus`` package (installed by ``make test`` through
``hack/test-deps.sh``, never by this test), started on 127.0.0.1 with a 1 s scrape and rule
interval and the repository's dashboards/rules.yaml. The jobs cover the paths the panels show:
plain successes, a failure, topology-placed GPU jobs with a gang.
"""

from __future__ import annotations

import json
import math
import re
import runpy
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import keys
from support.jobs import mpijob
from support.kube import ROOT
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess, free_port
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

SCRAPE_JOB = "mpijob-operator-metrics"
#: Grafana's variables, as the dashboard resolves them: every job, a window covering the run.
VARIABLES = {"$job": ".+", "$__rate_interval": "10m"}


class Prometheus:
    """A Prometheus process on 127.0.0.1 with its own config, data and log."""

    def __init__(self, workdir: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        assert binary, (
            "prometheus is not on PATH: `make test` installs it (hack/test-deps.sh), or run "
            "sudo apt-get update && sudo apt-get install -y --no-install-recommends prometheus"
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ROOT / "dashboards" / "rules.yaml")],
            "scrape_configs": [{"job_name": SCRAPE_JOB, "static_configs": [{"targets": [target]}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def values(self, expr: str) -> list[float]:
        return [float(s["value"][1]) for s in self.api("query", query=expr)["result"]]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def prometheus(operator: OperatorProcess, tmp_path: Path) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path, f"127.0.0.1:{operator.port}")
    try:
        wait_until(
            lambda: prom.values(f'up{{job="{SCRAPE_JOB}"}}') == [1.0],
            timeout=60,
            what="Prometheus scraping the operator",
        )
        yield prom
    finally:
        prom.stop()


def resolved(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def every_query() -> dict[str, str]:
    """Panel queries, rule expressions, recorded series and alert signals, by where they come
    from."""
    generate = runpy.run_path(str(ROOT / "dashboards" / "generate.py"), run_name="generate")
    board = json.loads((ROOT / "dashboards" / "mpijob-operator.json").read_text())
    queries = {}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            queries[f"panel {panel['title']!r} {target['refId']}"] = resolved(target["expr"])
    rules = yaml.safe_load((ROOT / "dashboards" / "rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                queries[f"rule {rule['record']}"] = rule["expr"]
                queries[f"recorded {rule['record']}"] = rule["record"]
    for alert in generate["ALERTS"]:
        queries[f"alert {alert.name} signal"] = alert.signal
    return queries


def run_jobs(mpijobs: MPIJobs) -> None:
    """Successes, a failure and topology-placed gang GPU jobs, all to their end."""
    succeed = {keys.SIM_SUCCEED_AFTER: "3s"}
    for i in range(3):
        mpijobs.create(mpijob(f"pi-{i}", workers=2, launcher_annotations=succeed))
    for i in range(2):
        mpijobs.create(
            mpijob(
                f"gpu-{i}",
                workers=4,
                gpus=1,
                launcher_annotations=succeed,
                annotations={keys.GPU_TOPOLOGY: "true"},
                run_policy={"schedulingPolicy": {"minAvailable": 5}},
            )
        )
    mpijobs.create(
        mpijob(
            "fails",
            workers=1,
            launcher_annotations={keys.SIM_FAIL_AFTER: "2s"},
            run_policy={"backoffLimit": 0},
        )
    )
    for name in ("pi-0", "pi-1", "pi-2", "gpu-0", "gpu-1"):
        mpijobs.wait_condition(name, "Succeeded", timeout=120)
    mpijobs.wait_condition("fails", "Failed", timeout=120)


def test_every_dashboard_and_rule_query_returns_data(
    operator: OperatorProcess, mpijobs: MPIJobs, prometheus: Prometheus
) -> None:
    run_jobs(mpijobs)
    queries = every_query()

    def empty() -> dict[str, str]:
        missing = {}
        for where, expr in queries.items():
            values = prometheus.values(expr)
            if not values or not all(math.isfinite(v) for v in values):
                missing[where] = f"{expr} -> {values}"
        return missing

    # Rates and quantiles need two scrapes after the last observation: poll until they settle.
    last: dict[str, str] = {}

    def settled() -> bool:
        nonlocal last
        last = empty()
        return not last

    try:
        wait_until(settled, timeout=60, interval=2, what="data for every query")
    except AssertionError:
        pytest.fail("queries without data:\n" + "\n".join(f"  {k}: {v}" for k, v in last.items()))

    for rule in prometheus.api("rules")["groups"]:
        for r in rule["rules"]:
            assert r["health"] == "ok", r
    created = prometheus.values("sum(mpi_operator_jobs_created_total)")
    assert created == [6.0]
    assert prometheus.values("sum(mpi_operator_jobs_failed_total)") == [1.0]
    assert re.search(r"\bpanic\b", prometheus.log.read_text()) is None
