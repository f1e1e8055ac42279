"""Upstream's in-memory defaulting of an MPIJob (Go ``SetDefaults_MPIJob``).

The controller applies these before validating and before every sync, so a job written for the
Go operator behaves the same even when the API server's CRD carries no defaults. Returns a
copy; the parsed object is never changed. Called by the handlers after :func:`mpijob.api.parse`.
"""

from __future__ import annotations

from mpijob import keys
from mpijob.api.models import MPIJob, ReplicaSpec


def with_defaults(job: MPIJob, *, clean_pod_policy: str = keys.CLEAN_POD_NONE) -> MPIJob:
    """A copy of ``job`` with upstream's Go defaults filled in where fields are unset.

    ``clean_pod_policy`` is the cleanPodPolicy of a job that sets none: upstream's ``None``
    unless a cluster admin chose another (``--default-clean-pod-policy``).

    Only the models it may change are copied (the spec, its run policy, the replica specs);
    the rest, the pod templates above all, is shared with ``job``, which is never changed.
    A deep copy of the whole job was most of what checking a job cost (a profile of
    ``make bench``: 1.6 % of 2.6 %).
    """
    spec = job.spec.model_copy()
    spec.run_policy = spec.run_policy.model_copy()
    if spec.mpi_replica_specs is not None:
        spec.mpi_replica_specs = {
            kind: replica.model_copy() if replica is not None else None
            for kind, replica in spec.mpi_replica_specs.items()
        }
    if spec.run_policy.clean_pod_policy is None:
        # The type's comment says Running, but upstream's code defaults to None.
        spec.run_policy.clean_pod_policy = clean_pod_policy
    if spec.slots_per_worker is None:
        spec.slots_per_worker = 1
    if not spec.ssh_auth_mount_path:
        spec.ssh_auth_mount_path = keys.DEFAULT_SSH_AUTH_MOUNT_PATH
    if not spec.mpi_implementation:
        spec.mpi_implementation = keys.IMPL_OPENMPI
    if not spec.launcher_creation_policy:
        spec.launcher_creation_policy = keys.LAUNCHER_AT_STARTUP
    _default_replica(spec.launcher, replicas=1, restart_policy=keys.RESTART_ON_FAILURE)
    _default_replica(spec.worker, replicas=0, restart_policy=keys.RESTART_NEVER)
    return job.model_copy(update={"spec": spec})


def _default_replica(spec: ReplicaSpec | None, *, replicas: int, restart_policy: str) -> None:
    if spec is None:
        return
    if not spec.restart_policy:
        spec.restart_policy = restart_policy
    if spec.replicas is None:
        spec.replicas = replicas
