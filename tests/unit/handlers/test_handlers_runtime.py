"""What the handlers keep per job lasts as long as the job."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from mpijob import metrics
from mpijob.handlers.runtime import JobMetrics

pytestmark = pytest.mark.unit


def info_series(namespace: str) -> list[dict[str, str]]:
    return [
        s.labels
        for family in REGISTRY.collect()
        if family.name == "mpi_operator_job_info"
        for s in family.samples
        if s.labels.get("namespace") == namespace
    ]


def test_a_deleted_job_takes_its_job_info_series_with_it() -> None:
    jm = JobMetrics()
    for i in range(3):
        metrics.JOB_INFO.labels(launcher=f"j{i}-launcher", namespace="forget-ns").set(1)
    jm.forget(("forget-ns", "j1"))
    jm.forget(("forget-ns", "never-seen"))  # a job that never had a launcher: nothing to drop
    assert sorted(s["launcher"] for s in info_series("forget-ns")) == ["j0-launcher", "j2-launcher"]
