"""Malformed MPIJobs: each is rejected with a message naming the field, and nothing breaks.

Every file in tests/data/invalid states in its first line who must reject it: the API server
(CRD schema and CEL rules) or the operator (validation, reported as a Warning Event and an
``Invalid`` condition). The operator keeps running, and a valid job submitted alongside succeeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = pytest.mark.integration

INVALID = Path(__file__).resolve().parents[1] / "data" / "invalid"


def cases() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted(INVALID.glob("*.yaml")):
        _, who, field = path.read_text().splitlines()[0].split(maxsplit=3)[1:4]
        out.append((path.name, who, field))
    return out


CASES = cases()


def test_there_are_at_least_twenty_distinct_malformed_jobs() -> None:
    assert len(CASES) >= 20
    assert {who for _, who, _ in CASES} == {"apiserver", "operator"}


def test_each_malformed_job_is_rejected_naming_its_field(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    valid = mpijob("valid", workers=2, launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"})
    mpijobs.create(valid)
    by_operator = []
    for filename, who, field in CASES:
        text = (INVALID / filename).read_text()
        out = crds.kubectl("apply", "-n", namespace, "-f", "-", input=text, check=False)
        if who == "apiserver":
            assert "created" not in out, f"{filename}: the API server accepted it"
            assert field in out, f"{filename}: rejection does not name {field}: {out}"
        else:
            assert "created" in out, f"{filename}: the API server rejected it: {out}"
            by_operator.append((yaml.safe_load(text)["metadata"]["name"], field, filename))

    for name, field, filename in by_operator:
        condition = mpijobs.wait_condition(name, keys.COND_INVALID, timeout=30)
        assert condition["reason"] == "ValidationError"
        assert field in condition["message"], f"{filename}: {condition['message']}"
        event = mpijobs.wait_event(name, "ValidationError")
        assert event["type"] == "Warning"
        assert field in event["message"]
        assert not crds.core.list_namespaced_pod(
            namespace, label_selector=f"{keys.LABEL_JOB_NAME}={name}"
        ).items

    assert operator.alive(), operator.logs()
    mpijobs.wait_condition("valid", "Succeeded", timeout=90)


def test_a_fixed_job_loses_its_invalid_condition_and_runs(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    job = mpijob("fixme", workers=1, launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"})
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"] = "oops"
    mpijobs.create(job)
    mpijobs.wait_condition("fixme", keys.COND_INVALID)
    mpijobs.patch(
        "fixme", {"spec": {"mpiReplicaSpecs": {"Worker": {"template": {"spec": {"volumes": []}}}}}}
    )
    mpijobs.wait_condition("fixme", "Succeeded", timeout=90)
    wait_until(
        lambda: mpijobs.condition("fixme", keys.COND_INVALID) is None,
        what="the Invalid condition removed",
    )
