"""MPIJob fixtures for the gang tests, written as the upstream PodGroup tests write theirs."""

from __future__ import annotations

from typing import Any

from mpijob import api
from mpijob.api import MPIJob


def template(*requests: dict[str, str], priority_class: str = "", **spec: Any) -> dict[str, Any]:
    """A pod template with one container per ``requests`` mapping."""
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": r}} for r in requests],
        **spec,
    }
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    return {"spec": pod_spec}


def job(
    *,
    launcher: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    workers: int | None = None,
    policy: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    name: str = "test",
    **spec: Any,
) -> MPIJob:
    """A defaulted MPIJob; ``worker`` or ``workers`` adds a Worker replica spec."""
    replica_specs: dict[str, Any] = {"Launcher": {"replicas": 1, "template": launcher or {}}}
    if worker is not None or workers is not None:
        replica_specs["Worker"] = {"replicas": workers, "template": worker or {}}
    body_spec: dict[str, Any] = {"mpiReplicaSpecs": replica_specs, **spec}
    if policy is not None:
        body_spec["runPolicy"] = {"schedulingPolicy": policy}
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": "uid-1"}
    if annotations:
        metadata["annotations"] = annotations
    body = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": metadata}
    return api.with_defaults(api.parse({**body, "spec": body_spec}))
