"""MPIJobs for the builder and status tests, built the way the handlers build them."""

from __future__ import annotations

from typing import Any

from mpijob import api
from support.jobs import body, parsed

OWNER = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "name": "foo",
    "uid": "uid-foo",
    "controller": True,
    "blockOwnerDeletion": True,
}


def container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "mpioperator/mpi-pi:openmpi", **extra}


def make_job(
    *,
    name: str = "foo",
    namespace: str = "bar",
    workers: int | None = 2,
    implementation: str | None = None,
    slots: int | None = None,
    launcher_as_worker: bool | None = None,
    run_policy: dict[str, Any] | None = None,
    launcher_template: dict[str, Any] | None = None,
    worker_template: dict[str, Any] | None = None,
    **spec: Any,
) -> api.MPIJob:
    """A parsed and defaulted MPIJob; ``workers=None`` leaves out the Worker spec."""
    if implementation is not None:
        spec["mpiImplementation"] = implementation
    if slots is not None:
        spec["slotsPerWorker"] = slots
    if launcher_as_worker is not None:
        spec["runLauncherAsWorker"] = launcher_as_worker
    if run_policy is not None:
        spec["runPolicy"] = run_policy
    worker = worker_template or {"spec": {"containers": [container("worker")]}}
    return parsed(
        body(
            name,
            namespace,
            launcher=launcher_template or {"spec": {"containers": [container("launcher")]}},
            launcher_replicas=None,
            worker=worker if workers is not None else None,
            workers=workers,
            **spec,
        )
    )


def pod(
    name: str,
    phase: str,
    *,
    ready: bool = False,
    reason: str | None = None,
    message: str | None = None,
    created: str | None = None,
    owner_uid: str | None = None,
) -> dict[str, Any]:
    """A pod as the API returns it, reduced to what the status rules read."""
    metadata: dict[str, Any] = {"name": name, "namespace": "bar"}
    if created:
        metadata["creationTimestamp"] = created
    if owner_uid:
        metadata["ownerReferences"] = [{"kind": "Job", "uid": owner_uid, "controller": True}]
    status: dict[str, Any] = {"phase": phase}
    if ready:
        # A Ready pod has its IP: the kubelet sets it before any container starts.
        status["conditions"] = [{"type": "Ready", "status": "True"}]
        status["podIP"] = "10.0.0.1"
    if reason is not None:
        status["reason"] = reason
    if message is not None:
        status["message"] = message
    return {"metadata": metadata, "status": status}
