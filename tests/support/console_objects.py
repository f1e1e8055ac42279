"""MPIJob and Pod bodies as the API returns them, for the console's pure tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mpijob import keys
from support.jobs import body

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def condition(type_: str, status: str = "True") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": f"MPIJob{type_}"}


def job_body(
    name: str = "vgg16",
    *,
    conditions: list[dict[str, Any]] | None = None,
    start: str | None = "2026-03-01T11:58:30Z",
    completion: str | None = None,
    priority_class: str | None = None,
    namespace: str = "team-a",
    workers: int = 4,
    gpus: int = 1,
    launcher_gpus: int = 0,
) -> dict[str, Any]:
    """An MPIJob of ``workers`` workers with ``gpus`` GPUs each (the launcher ``launcher_gpus``)."""
    status: dict[str, Any] = {"conditions": conditions or []}
    if start:
        status["startTime"] = start
    if completion:
        status["completionTime"] = completion
    annotations = {keys.GPU_TOPOLOGY: "true"}
    policy: dict[str, Any] = {"minAvailable": 5}
    if priority_class:
        policy["priorityClass"] = priority_class
    job = body(
        name,
        namespace,
        metadata={"creationTimestamp": "2026-03-01T11:58:00Z", "annotations": annotations},
        runPolicy={"cleanPodPolicy": keys.CLEAN_POD_RUNNING, "schedulingPolicy": policy},
        mpiReplicaSpecs={
            keys.REPLICA_LAUNCHER: {"replicas": 1, "template": pod_template(launcher_gpus)},
            keys.REPLICA_WORKER: {"replicas": workers, "template": pod_template(gpus)},
        },
    )
    return {**job, "status": status}


def pod_template(gpus: int) -> dict[str, Any]:
    """A replica's pod template whose one container has a ``gpus`` limit (none when 0)."""
    resources = {"limits": {keys.GPU_RESOURCE: str(gpus)}} if gpus else {}
    return {"spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}}


def pod_body(
    name: str,
    *,
    job: str = "vgg16",
    role: str = keys.ROLE_WORKER,
    phase: str = "Running",
    gpus: int = 1,
    gpu_ids: str | None = None,
    node: str | None = "gpu-node-0",
    created: str = "2026-03-01T11:59:00Z",
    namespace: str = "team-a",
) -> dict[str, Any]:
    annotations = {keys.GPU_IDS: gpu_ids} if gpu_ids else {}
    spec: dict[str, Any] = pod_template(gpus)["spec"]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": created,
            "labels": {
                keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME,
                keys.LABEL_JOB_NAME: job,
                keys.LABEL_JOB_ROLE: role,
            },
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def topology_job_pods() -> list[dict[str, Any]]:
    """A 4-worker topology job on one DGX-1, listed out of order."""
    workers = [
        pod_body(f"vgg16-worker-{i}", gpu_ids=str(gpu))
        for i, gpu in [(2, 2), (0, 0), (3, 3), (1, 1), (10, 6)]
    ]
    launcher = pod_body("vgg16-launcher-x7k2p", role=keys.ROLE_LAUNCHER, gpus=0, node="gpu-node-1")
    return [*workers, launcher]


def decision_body(job: dict[str, Any], summary: str, *, uid: str | None = None) -> dict[str, Any]:
    """The job's PlacementDecision (written for ``uid``, by default the job's own)."""
    meta = job["metadata"]
    return {
        "apiVersion": keys.DECISION_API_VERSION,
        "kind": keys.DECISION_KIND,
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {
            "job": {"name": meta["name"], "uid": uid or meta["uid"]},
            "summary": summary,
            "workers": [],
        },
    }
