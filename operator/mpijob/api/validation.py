"""Upstream's validation of an MPIJob (``pkg/apis/kubeflow/validation``), same checks, same order.

Runs after :func:`mpijob.api.defaults.with_defaults`, as the Go controller does; without
defaulting (the "empty job" case) the Required errors show. What the API server can check
itself is also in the CRD's CEL rules; this covers jobs stored under upstream's CRD too.
Called by the handlers; :func:`mpijob.api.errors.validation_message` words the Event.
"""

from __future__ import annotations

import re

from mpijob import keys
from mpijob.api.errors import FieldError, invalid, not_supported, required
from mpijob.api.models import MPIJob, MPIJobSpec, ReplicaSpec, RunPolicy

DNS1035_LABEL_MAX_LENGTH = 63
_DNS1035_FORMAT = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035 = re.compile(f"^{_DNS1035_FORMAT}$")
_DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an"
    " alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or"
    f" 'abc-123', regex used for validation is '{_DNS1035_FORMAT}')"
)
_NEGATIVE = "must be greater than or equal to 0"

VALID_RESTART_POLICIES = (keys.RESTART_NEVER, keys.RESTART_ON_FAILURE)
VALID_CLEAN_POD_POLICIES = (keys.CLEAN_POD_NONE, keys.CLEAN_POD_RUNNING, keys.CLEAN_POD_ALL)
VALID_MANAGED_BY = (keys.MANAGED_BY_UPSTREAM, keys.MANAGED_BY_MULTIKUEUE)
VALID_IMPLEMENTATIONS = (keys.IMPL_OPENMPI, keys.IMPL_INTEL, keys.IMPL_MPICH)


def dns1035_label_errors(value: str) -> list[str]:
    """apimachinery ``IsDNS1035Label``: the reasons ``value`` is not a DNS-1035 label."""
    errors = []
    if len(value) > DNS1035_LABEL_MAX_LENGTH:
        errors.append(f"must be no more than {DNS1035_LABEL_MAX_LENGTH} characters")
    if not _DNS1035.match(value):
        errors.append(_DNS1035_MESSAGE)
    return errors


def validate(job: MPIJob) -> list[FieldError]:
    """Every validation error of ``job``, in upstream's order; empty when the job is valid."""
    return [*_validate_name(job), *_validate_spec(job.spec, "spec")]


def _validate_name(job: MPIJob) -> list[FieldError]:
    # The longest hostname the job will give a pod is its last worker's.
    worker = job.spec.worker
    replicas = 1
    if worker is not None and worker.replicas is not None and worker.replicas > 0:
        replicas = worker.replicas
    hostname = f"{job.name}-worker-{replicas - 1}"
    problems = dns1035_label_errors(hostname)
    if not problems:
        return []
    detail = (
        f'will not able to create pod and service with invalid DNS label "{hostname}": '
        + ", ".join(problems)
    )
    return [invalid("metadata.name", job.name, detail)]


def _validate_spec(spec: MPIJobSpec, path: str) -> list[FieldError]:
    errors = _validate_replica_specs(spec, f"{path}.mpiReplicaSpecs")
    slots = f"{path}.slotsPerWorker"
    if spec.slots_per_worker is None:
        errors.append(required(slots, "must have number of slots per worker"))
    elif spec.slots_per_worker < 0:
        errors.append(invalid(slots, spec.slots_per_worker, _NEGATIVE))
    errors += _validate_run_policy(spec.run_policy, f"{path}.runPolicy")
    if not spec.ssh_auth_mount_path:
        errors.append(
            required(f"{path}.sshAuthMountPath", "must have a mount path for SSH credentials")
        )
    if spec.mpi_implementation not in VALID_IMPLEMENTATIONS:
        errors.append(
            not_supported(
                f"{path}.mpiImplementation", spec.mpi_implementation, VALID_IMPLEMENTATIONS
            )
        )
    return errors


def _validate_run_policy(policy: RunPolicy, path: str) -> list[FieldError]:
    errors = []
    clean = f"{path}.cleanPodPolicy"
    if policy.clean_pod_policy is None:
        errors.append(required(clean, "must have clean Pod policy"))
    elif policy.clean_pod_policy not in VALID_CLEAN_POD_POLICIES:
        errors.append(not_supported(clean, policy.clean_pod_policy, VALID_CLEAN_POD_POLICIES))
    for name, value in (
        ("ttlSecondsAfterFinished", policy.ttl_seconds_after_finished),
        ("activeDeadlineSeconds", policy.active_deadline_seconds),
        ("backoffLimit", policy.backoff_limit),
    ):
        if value is not None and value < 0:
            errors.append(invalid(f"{path}.{name}", value, _NEGATIVE))
    if policy.managed_by is not None and policy.managed_by not in VALID_MANAGED_BY:
        errors.append(not_supported(f"{path}.managedBy", policy.managed_by, VALID_MANAGED_BY))
    return errors


def _validate_replica_specs(spec: MPIJobSpec, path: str) -> list[FieldError]:
    if spec.mpi_replica_specs is None:
        return [required(path, "must have replica specs")]
    errors = []
    launcher_path = f"{path}[{keys.REPLICA_LAUNCHER}]"
    launcher = spec.launcher
    if launcher is None:
        errors.append(required(launcher_path, f"must have {keys.REPLICA_LAUNCHER} replica spec"))
    else:
        errors += _validate_replica(launcher, launcher_path)
        if launcher.replicas is not None and launcher.replicas != 1:
            errors.append(invalid(f"{launcher_path}.replicas", launcher.replicas, "must be 1"))
    worker = spec.worker
    if worker is not None:
        worker_path = f"{path}[{keys.REPLICA_WORKER}]"
        errors += _validate_replica(worker, worker_path)
        if worker.replicas is not None and worker.replicas <= 0:
            errors.append(
                invalid(
                    f"{worker_path}.replicas",
                    worker.replicas,
                    "must be greater than or equal to 1",
                )
            )
    return errors


def _validate_replica(spec: ReplicaSpec, path: str) -> list[FieldError]:
    errors = []
    if spec.replicas is None:
        errors.append(required(f"{path}.replicas", "must define number of replicas"))
    if spec.restart_policy not in VALID_RESTART_POLICIES:
        errors.append(
            not_supported(f"{path}.restartPolicy", spec.restart_policy, VALID_RESTART_POLICIES)
        )
    if not _containers(spec):
        errors.append(
            required(f"{path}.template.spec.containers", "must define at least one container")
        )
    return errors


def _containers(spec: ReplicaSpec) -> list[object]:
    pod_spec = spec.template.get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
    return containers if isinstance(containers, list) else []
