"""Upstream validation: counterparts of ``validation/validation_test.go`` ``TestValidateMPIJob``.

Expected errors are exact (path and message) and in upstream's order.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpijob import api
from mpijob.api.errors import FieldError

pytestmark = pytest.mark.unit

CONTAINERS = {"spec": {"containers": [{"name": "main", "image": "mpi"}]}}
DNS1035 = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an"
    " alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or"
    " 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
LAUNCHER = "spec.mpiReplicaSpecs[Launcher]"
WORKER = "spec.mpiReplicaSpecs[Worker]"


def _job(name: str = "foo", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "slotsPerWorker": 2,
        "runPolicy": {"cleanPodPolicy": "None"},
        "sshAuthMountPath": "/home/mpiuser/.ssh",
        "mpiImplementation": "Intel",
        "mpiReplicaSpecs": {
            "Launcher": {
                "replicas": 1,
                "restartPolicy": "Never",
                "template": copy.deepcopy(CONTAINERS),
            }
        },
    }
    body.update(spec)
    return {"metadata": {"name": name}, "spec": body}


def _worker(replicas: int = 3) -> dict[str, Any]:
    return {"replicas": replicas, "restartPolicy": "Never", "template": copy.deepcopy(CONTAINERS)}


def _errors(body: dict[str, Any]) -> list[FieldError]:
    return api.validate(api.parse(body))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_job(), id="valid (intel)"),
        pytest.param(
            _job(mpiReplicaSpecs={**_job()["spec"]["mpiReplicaSpecs"], "Worker": _worker()}),
            id="valid with worker (intel)",
        ),
        pytest.param(_job(mpiImplementation="MPICH"), id="valid (mpich)"),
        pytest.param(
            _job(
                mpiImplementation="MPICH",
                mpiReplicaSpecs={**_job()["spec"]["mpiReplicaSpecs"], "Worker": _worker()},
            ),
            id="valid with worker (mpich)",
        ),
    ],
)
def test_validate_mpi_job_valid(body: dict[str, Any]) -> None:
    """Counterpart of upstream TestValidateMPIJob "valid (intel)", "valid (mpich)", with workers."""
    assert _errors(body) == []


def test_validate_mpi_job_empty_job() -> None:
    """Counterpart of upstream TestValidateMPIJob "empty job"."""
    assert _errors({}) == [
        FieldError(
            "metadata.name",
            'Invalid value: "": will not able to create pod and service with invalid DNS label '
            f'"-worker-0": {DNS1035}',
        ),
        FieldError("spec.mpiReplicaSpecs", "Required value: must have replica specs"),
        FieldError("spec.slotsPerWorker", "Required value: must have number of slots per worker"),
        FieldError("spec.runPolicy.cleanPodPolicy", "Required value: must have clean Pod policy"),
        FieldError(
            "spec.sshAuthMountPath", "Required value: must have a mount path for SSH credentials"
        ),
        FieldError(
            "spec.mpiImplementation",
            'Unsupported value: "": supported values: "Intel", "MPICH", "OpenMPI"',
        ),
    ]


def test_validate_mpi_job_invalid_fields() -> None:
    """Counterpart of upstream TestValidateMPIJob "invalid fields"."""
    name = "this-name-is-waaaaaaaay-too-long-for-a-worker-hostname-of-a-pod"
    body = _job(
        name=name,
        mpiImplementation="Unknown",
        runPolicy={
            "cleanPodPolicy": "unknown",
            "ttlSecondsAfterFinished": -1,
            "activeDeadlineSeconds": -1,
            "backoffLimit": -1,
            "managedBy": "invalid.com/controller",
        },
        mpiReplicaSpecs={**_job()["spec"]["mpiReplicaSpecs"], "Worker": _worker(1000)},
    )
    assert _errors(body) == [
        FieldError(
            "metadata.name",
            f'Invalid value: "{name}": will not able to create pod and service with invalid DNS'
            f' label "{name}-worker-999": must be no more than 63 characters',
        ),
        FieldError(
            "spec.runPolicy.cleanPodPolicy",
            'Unsupported value: "unknown": supported values: "All", "None", "Running"',
        ),
        FieldError(
            "spec.runPolicy.ttlSecondsAfterFinished",
            "Invalid value: -1: must be greater than or equal to 0",
        ),
        FieldError(
            "spec.runPolicy.activeDeadlineSeconds",
            "Invalid value: -1: must be greater than or equal to 0",
        ),
        FieldError(
            "spec.runPolicy.backoffLimit", "Invalid value: -1: must be greater than or equal to 0"
        ),
        FieldError(
            "spec.runPolicy.managedBy",
            'Unsupported value: "invalid.com/controller": supported values: '
            '"kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue"',
        ),
        FieldError(
            "spec.mpiImplementation",
            'Unsupported value: "Unknown": supported values: "Intel", "MPICH", "OpenMPI"',
        ),
    ]


def test_validate_mpi_job_empty_replica_specs() -> None:
    """Counterpart of upstream TestValidateMPIJob "empty replica specs"."""
    assert _errors(_job(mpiReplicaSpecs={})) == [
        FieldError(LAUNCHER, "Required value: must have Launcher replica spec")
    ]


def test_validate_mpi_job_missing_replica_spec_fields() -> None:
    """Counterpart of upstream TestValidateMPIJob "missing replica spec fields"."""
    errors = _errors(_job(mpiReplicaSpecs={"Launcher": {}, "Worker": {}}))
    expected = []
    for path in (LAUNCHER, WORKER):
        expected += [
            FieldError(f"{path}.replicas", "Required value: must define number of replicas"),
            FieldError(
                f"{path}.restartPolicy",
                'Unsupported value: "": supported values: "Never", "OnFailure"',
            ),
            FieldError(
                f"{path}.template.spec.containers",
                "Required value: must define at least one container",
            ),
        ]
    assert errors == expected


def test_validate_mpi_job_invalid_replica_fields() -> None:
    """Counterpart of upstream TestValidateMPIJob "invalid replica fields"."""
    launcher = {"replicas": 2, "restartPolicy": "Always", "template": CONTAINERS}
    worker = {"replicas": 0, "restartPolicy": "Invalid", "template": CONTAINERS}
    errors = _errors(_job(mpiReplicaSpecs={"Launcher": launcher, "Worker": worker}))
    assert errors == [
        FieldError(
            f"{LAUNCHER}.restartPolicy",
            'Unsupported value: "Always": supported values: "Never", "OnFailure"',
        ),
        FieldError(f"{LAUNCHER}.replicas", "Invalid value: 2: must be 1"),
        FieldError(
            f"{WORKER}.restartPolicy",
            'Unsupported value: "Invalid": supported values: "Never", "OnFailure"',
        ),
        FieldError(f"{WORKER}.replicas", "Invalid value: 0: must be greater than or equal to 1"),
    ]


def test_validate_mpi_job_invalid_mpi_job_name() -> None:
    """Counterpart of upstream TestValidateMPIJob "invalid mpiJob name"."""
    assert _errors(_job(name="1-foo")) == [
        FieldError(
            "metadata.name",
            'Invalid value: "1-foo": will not able to create pod and service with invalid DNS'
            f' label "1-foo-worker-0": {DNS1035}',
        )
    ]


def test_worker_without_replicas_is_rejected_after_defaulting() -> None:
    """A Worker spec without replicas defaults to 0 and is then refused, as upstream does."""
    body = _job(mpiReplicaSpecs={**_job()["spec"]["mpiReplicaSpecs"], "Worker": _worker()})
    del body["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    errors = api.validate(api.with_defaults(api.parse(body)))
    assert errors == [
        FieldError(f"{WORKER}.replicas", "Invalid value: 0: must be greater than or equal to 1")
    ]


def test_validation_message_aggregates_like_upstream() -> None:
    """One error bare, several in brackets, duplicates once, all cut to 1024 bytes."""
    one = [FieldError("spec.a", "Required value: x")]
    assert api.validation_message(one) == "Found validation errors: spec.a: Required value: x"
    two = [*one, FieldError("spec.b", "Required value: y"), *one]
    assert api.validation_message(two) == (
        "Found validation errors: [spec.a: Required value: x, spec.b: Required value: y]"
    )
    many = [FieldError(f"spec.f{i}", "Required value: " + "z" * 50) for i in range(40)]
    message = api.validation_message(many)
    assert len(message.encode()) == 1024
    assert message.endswith("...")
    assert api.InvalidMPIJob(many).message == message
