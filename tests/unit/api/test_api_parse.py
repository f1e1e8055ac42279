"""Parsing raw MPIJob bodies: models, field-path errors, and never crashing on garbage."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mpijob import api

pytestmark = pytest.mark.unit

VALID: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "pi", "namespace": "default", "uid": "u-1", "labels": {"a": "b"}},
    "spec": {
        "slotsPerWorker": 1,
        "runPolicy": {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 60},
        "sshAuthMountPath": "/home/mpiuser/.ssh",
        "futureField": {"kept": True},
        "mpiReplicaSpecs": {
            "Launcher": {
                "replicas": 1,
                "template": {"spec": {"containers": [{"name": "l", "image": "mpi"}]}},
            },
            "Worker": {
                "replicas": 2,
                "template": {"spec": {"containers": [{"name": "w", "image": "mpi"}]}},
            },
        },
    },
    "status": {
        "conditions": [
            {
                "type": "Created",
                "status": "True",
                "reason": "MPIJobCreated",
                "message": "MPIJob default/pi is created.",
                "lastUpdateTime": "2024-05-01T10:00:00Z",
                "lastTransitionTime": "2024-05-01T10:00:00Z",
            }
        ],
        "replicaStatuses": {"Launcher": {}, "Worker": {"active": 2}},
        "startTime": "2024-05-01T10:00:00Z",
    },
}


def test_parse_reads_every_upstream_field_and_keeps_unknown_ones() -> None:
    job = api.parse(VALID)
    assert job.key == "default/pi"
    assert job.spec.worker_replicas == 2
    assert job.spec.run_policy.ttl_seconds_after_finished == 60
    assert job.spec.launcher is not None
    assert job.spec.launcher.template == VALID["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    assert job.spec.model_extra == {"futureField": {"kept": True}}
    assert job.status.is_true("Created")
    assert job.status.to_body() == VALID["status"]


def test_parse_does_not_share_the_template_with_the_body() -> None:
    job = api.parse(VALID)
    assert job.spec.launcher is not None
    job.spec.launcher.template["spec"]["containers"].append({"name": "extra"})
    assert len(VALID["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]) == 1


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"slotsPerWorker": "4"}, "spec.slotsPerWorker"),
        ({"slotsPerWorker": 2**31}, "spec.slotsPerWorker"),
        ({"runLauncherAsWorker": "true"}, "spec.runLauncherAsWorker"),
        ({"runPolicy": {"backoffLimit": 1.5}}, "spec.runPolicy.backoffLimit"),
        ({"runPolicy": {"suspend": "yes"}}, "spec.runPolicy.suspend"),
        ({"runPolicy": []}, "spec.runPolicy"),
        (
            {"mpiReplicaSpecs": {"Worker": {"replicas": "2"}}},
            "spec.mpiReplicaSpecs[Worker].replicas",
        ),
        (
            {"mpiReplicaSpecs": {"Worker": {"template": []}}},
            "spec.mpiReplicaSpecs[Worker].template",
        ),
        ({"mpiImplementation": 3}, "spec.mpiImplementation"),
    ],
)
def test_parse_reports_type_errors_with_field_paths(patch: dict[str, Any], path: str) -> None:
    body = {"metadata": {"name": "pi"}, "spec": patch}
    with pytest.raises(api.InvalidMPIJob) as caught:
        api.parse(body)
    assert [e.path for e in caught.value.errors] == [path]
    assert caught.value.message.startswith(f"Found validation errors: {path}: Invalid value: ")


@pytest.mark.parametrize(
    ("template", "path"),
    [
        ({"spec": {"containers": {"name": "x"}}}, "template.spec.containers"),
        ({"spec": {"containers": ["x"]}}, "template.spec.containers[0]"),
        ({"spec": {"containers": [{"env": {"A": "1"}}]}}, "template.spec.containers[0].env"),
        ({"spec": {"containers": [{"command": "sshd"}]}}, "template.spec.containers[0].command"),
        ({"spec": {"containers": [{"args": [1]}]}}, "template.spec.containers[0].args[0]"),
        ({"spec": {"volumes": {}}}, "template.spec.volumes"),
        ({"spec": {"hostNetwork": "true"}}, "template.spec.hostNetwork"),
        ({"spec": {"dnsConfig": {"searches": "a"}}}, "template.spec.dnsConfig.searches"),
        ({"metadata": {"labels": {"a": 1}}}, "template.metadata.labels[a]"),
        ({"metadata": []}, "template.metadata"),
        ({"spec": "x"}, "template.spec"),
    ],
)
def test_parse_checks_the_template_shapes_builders_rely_on(
    template: dict[str, Any], path: str
) -> None:
    body = {"spec": {"mpiReplicaSpecs": {"Launcher": {"template": template}}}}
    with pytest.raises(api.InvalidMPIJob) as caught:
        api.parse(body)
    assert [e.path for e in caught.value.errors] == [f"spec.mpiReplicaSpecs[Launcher].{path}"]


def test_parse_accepts_nulls_where_kubernetes_writes_them() -> None:
    body = {
        "metadata": {"name": "pi", "creationTimestamp": None},
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"template": {"metadata": {"creationTimestamp": None}, "spec": None}},
                "Worker": None,
            }
        },
    }
    job = api.parse(body)
    assert job.spec.worker is None
    assert job.spec.launcher is not None


def _garbage(rng: random.Random, depth: int = 0) -> Any:
    choices: list[Any] = [None, True, 0, -1, 2**40, 1.5, "", "x", "Launcher"]
    if depth < 4:
        choices += ["dict", "list"]
    pick = rng.choice(choices)
    if pick == "dict":
        keys = [
            "metadata",
            "spec",
            "status",
            "name",
            "mpiReplicaSpecs",
            "Launcher",
            "Worker",
            "template",
            "containers",
            "replicas",
            "runPolicy",
            "conditions",
            "env",
            "labels",
        ]
        return {rng.choice(keys): _garbage(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if pick == "list":
        return [_garbage(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return pick


def test_parse_only_ever_raises_invalid_mpi_job() -> None:
    """A malformed object must never crash the operator: 3000 random bodies, one error type."""
    rng = random.Random(20240501)
    outcomes = {"parsed": 0, "invalid": 0}
    messages: list[str] = []
    for _ in range(3000):
        body = _garbage(rng)
        try:
            job = api.parse(body)
        except api.InvalidMPIJob as exc:
            messages.append(exc.message)
            outcomes["invalid"] += 1
        else:
            api.validate(api.with_defaults(job))
            outcomes["parsed"] += 1
    assert outcomes["parsed"] > 0
    assert outcomes["invalid"] > 0
    assert all(m.startswith("Found validation errors: ") for m in messages)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"spec": {"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}}},
            "kueue.x-k8s.io/multikueue",
        ),
        ({"spec": {"runPolicy": {"managedBy": 3}}}, None),
        ({"spec": {"runPolicy": None}}, None),
        ({"spec": []}, None),
        ({}, None),
        ([], None),
    ],
)
def test_managed_by_never_raises(body: Any, expected: str | None) -> None:
    assert api.managed_by(body) == expected
