"""Upstream defaulting: counterparts of ``v2beta1/default_test.go`` ``TestSetDefaults_MPIJob``."""

from __future__ import annotations

import pytest

from mpijob import api

pytestmark = pytest.mark.unit


def _defaulted(spec: dict[str, object]) -> api.MPIJob:
    return api.with_defaults(api.parse({"metadata": {"name": "foo"}, "spec": spec}))


def test_set_defaults_base_defaults() -> None:
    """Counterpart of upstream TestSetDefaults_MPIJob "base defaults"."""
    spec = _defaulted({}).spec
    assert spec.slots_per_worker == 1
    assert spec.run_policy.clean_pod_policy == "None"
    assert spec.ssh_auth_mount_path == "/root/.ssh"
    assert spec.mpi_implementation == "OpenMPI"
    assert spec.launcher_creation_policy == "AtStartup"
    assert spec.mpi_replica_specs is None


@pytest.mark.parametrize("implementation", ["Intel", "MPICH"])
def test_set_defaults_base_defaults_overridden(implementation: str) -> None:
    """Counterpart of upstream "base defaults overridden (intel)" and "(mpich)"."""
    spec = _defaulted(
        {
            "slotsPerWorker": 10,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "sshAuthMountPath": "/home/mpiuser/.ssh",
            "mpiImplementation": implementation,
            "launcherCreationPolicy": "WaitForWorkersReady",
        }
    ).spec
    assert spec.slots_per_worker == 10
    assert spec.run_policy.clean_pod_policy == "Running"
    assert spec.ssh_auth_mount_path == "/home/mpiuser/.ssh"
    assert spec.mpi_implementation == implementation
    assert spec.launcher_creation_policy == "WaitForWorkersReady"


def test_set_defaults_launcher_defaults() -> None:
    """Counterpart of upstream TestSetDefaults_MPIJob "launcher defaults"."""
    launcher = _defaulted({"mpiReplicaSpecs": {"Launcher": {}}}).spec.launcher
    assert launcher is not None
    assert launcher.replicas == 1
    assert launcher.restart_policy == "OnFailure"


def test_set_defaults_worker_defaults() -> None:
    """Counterpart of upstream TestSetDefaults_MPIJob "worker defaults"."""
    worker = _defaulted({"mpiReplicaSpecs": {"Worker": {}}}).spec.worker
    assert worker is not None
    assert worker.replicas == 0
    assert worker.restart_policy == "Never"


def test_defaults_keep_explicit_zero_slots_and_leave_input_alone() -> None:
    """Zero is a value, not "unset"; and defaulting returns a copy, the input unchanged down to
    its replica specs (only the templates are shared)."""
    template = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
    replicas = {"Launcher": {"template": template}, "Worker": {"template": template}}
    spec = {"slotsPerWorker": 0, "mpiReplicaSpecs": replicas}
    job = api.parse({"metadata": {"name": "foo"}, "spec": spec})
    before = job.model_dump()
    defaulted = api.with_defaults(job)
    assert defaulted.spec.slots_per_worker == 0
    assert job.spec.run_policy.clean_pod_policy is None
    assert defaulted.spec.run_policy.clean_pod_policy == "None"
    assert defaulted.spec.worker is not None
    assert defaulted.spec.worker.restart_policy == "Never"
    assert job.model_dump() == before
