"""Namespaces' GPU quotas hold in both GPU bindings: a topology job never gets GPUs past them.

In the dra binding the operator turns workers' ``nvidia.com/gpu`` into ResourceClaims it creates
itself, which a ``requests.nvidia.com/gpu`` quota never sees (shown below: the API server takes
such a claim and leaves the quota's ``used`` at 0). Our admission counts them instead, so the
same job waits in both bindings, its ``GangAdmitted`` condition naming the quota.

kwok runs no kubelet: launchers succeed by annotation, and what a worker got is read from its
claim (dra) or from the scheduler's binding (annotations).
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]


def topology_job(name: str, *, succeed_after: str = "3s") -> dict[str, Any]:
    """Two workers x 4 GPUs, placed by topology; the launcher (no GPU) succeeds
    ``succeed_after`` its workers are ready, and every pod goes with it (cleanPodPolicy All)."""
    return mpijob(
        name,
        workers=2,
        gpus=4,
        annotations={keys.GPU_TOPOLOGY: "true"},
        launcher_annotations={keys.SIM_SUCCEED_AFTER: succeed_after},
        spec={"launcherCreationPolicy": keys.LAUNCHER_WAIT_FOR_WORKERS_READY},
        run_policy={"cleanPodPolicy": "All"},
    )


def make_quota(cluster: Cluster, namespace: str, hard: dict[str, str]) -> None:
    """A ResourceQuota ``gpus``; returns once the quota controller has counted its usage
    (it writes ``status.hard`` with ``status.used``)."""
    body = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="gpus"), spec=client.V1ResourceQuotaSpec(hard=hard)
    )
    cluster.core.create_namespaced_resource_quota(namespace, body)

    def synced() -> bool:
        found = cluster.core.read_namespaced_resource_quota("gpus", namespace)
        return bool(found.status and found.status.hard)

    wait_until(synced, what="the quota's usage counted")


def used(cluster: Cluster, namespace: str) -> dict[str, str] | None:
    found = cluster.core.read_namespaced_resource_quota("gpus", namespace)
    return found.status.used if found.status else None


def wait_over_quota(mpijobs: MPIJobs, name: str) -> dict[str, Any]:
    """The job's ``GangAdmitted`` condition once it says the quota holds it back."""

    def probe() -> dict[str, Any] | None:
        c = mpijobs.condition(name, keys.COND_GANG_ADMITTED)
        return c if c and c["reason"] == keys.REASON_GPU_QUOTA_EXCEEDED else None

    condition = wait_until(probe, timeout=60, what=f"{name} waiting for its quota")
    assert condition["status"] == "False"
    return condition


def workers(cluster: Cluster, namespace: str, job: str) -> list[Any]:
    selector = f"{keys.LABEL_JOB_NAME}={job},{keys.LABEL_JOB_ROLE}={keys.ROLE_WORKER}"
    return cluster.core.list_namespaced_pod(namespace, label_selector=selector).items


def claims(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    found = cluster.resource(keys.DRA_API_VERSION, "ResourceClaim").get(namespace=namespace)
    return [c.to_dict() for c in found.items]


def gpu_claim(name: str, count: int) -> dict[str, Any]:
    """A claim for ``count`` GPUs of NVIDIA's class, as a tenant could write one."""
    request = {
        "name": "gpus",
        "exactly": {"deviceClassName": keys.NVIDIA_GPU_DRIVER, "count": count},
    }
    return {
        "apiVersion": keys.DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def gpu_pod(name: str, gpus: int) -> client.V1Pod:
    container = client.V1Container(
        name="c",
        image="busybox",
        resources=client.V1ResourceRequirements(limits={keys.GPU_RESOURCE: str(gpus)}),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name), spec=client.V1PodSpec(containers=[container])
    )


@pytest.mark.parametrize("binding", ["dra", "annotations"])
def test_a_zero_gpu_quota_gives_the_job_no_gpu_and_its_status_names_the_quota(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs, binding: str
) -> None:
    make_quota(crds, namespace, {keys.QUOTA_GPU_REQUESTS: "0", "limits.nvidia.com/gpu": "0"})
    op = start_operator(f"--gpu-binding={binding}")
    mpijobs.create(topology_job("capped"))
    condition = wait_over_quota(mpijobs, "capped")
    expected = (
        f"ResourceQuota gpus in namespace {namespace} allows requests.nvidia.com/gpu: 0; "
        "0 in use (0 counted by the API server, 0 held by this operator's placements) and this "
        "job needs 8"
    )
    assert condition["message"] == expected
    event = mpijobs.wait_event("capped", keys.REASON_GPU_QUOTA_EXCEEDED)
    assert (event["type"], event["message"]) == ("Warning", expected)
    op.wait_admission_passes(2)
    assert mpijobs.decision("capped") is None, "no GPU is reserved for it"
    assert workers(crds, namespace, "capped") == []
    assert claims(crds, namespace) == []
    assert mpijobs.condition("capped", keys.COND_GANG_ADMITTED) == condition

    # What each binding would meet without our admission's check: a pod asking for GPUs is
    # refused by the quota itself; a claim for GPUs is stored, and the quota counts none of it.
    with pytest.raises(ApiException) as refused:
        crds.core.create_namespaced_pod(namespace, gpu_pod("direct", 1))
    assert refused.value.status == 403
    assert "exceeded quota: gpus" in refused.value.body
    # The quota admission charges an object's usage before the create returns: what it does not
    # count by then, it never counts.
    crds.resource(keys.DRA_API_VERSION, "ResourceClaim").create(
        body=gpu_claim("direct", 4), namespace=namespace
    )
    assert (used(crds, namespace) or {}).get(keys.QUOTA_GPU_REQUESTS) == "0"


@pytest.mark.parametrize("binding", ["dra", "annotations"])
def test_with_a_quota_of_8_one_8_gpu_job_runs_and_the_next_waits_for_it(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs, binding: str
) -> None:
    make_quota(crds, namespace, {keys.QUOTA_GPU_REQUESTS: "8"})
    start_operator(f"--gpu-binding={binding}")
    mpijobs.create(topology_job("first", succeed_after="8s"))
    wait_until(lambda: mpijobs.decision("first"), what="the first job admitted")
    mpijobs.create(topology_job("second"))
    condition = wait_over_quota(mpijobs, "second")
    assert condition["message"].endswith("this job needs 8")

    # While the first job's workers are being created, the API server's `used` may count a worker
    # the operator's cache has not seen yet, whose GPUs the operator then still counts as its own
    # placement's: the sum is high for a moment, never low. The message settles on the truth.
    def settled() -> dict[str, Any] | None:
        c = mpijobs.condition("second", keys.COND_GANG_ADMITTED)
        ok = c and c["reason"] == keys.REASON_GPU_QUOTA_EXCEEDED
        return c if ok and "allows requests.nvidia.com/gpu: 8; 8 in use" in c["message"] else None

    wait_until(settled, timeout=60, what="the waiting message counting 8 GPUs in use")
    assert mpijobs.decision("second") is None

    def running_workers() -> list[Any] | None:
        pods = workers(crds, namespace, "first")
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else None

    wait_until(running_workers, what="the first job's workers bound")
    # Kubernetes counts the workers' GPUs only where they stay nvidia.com/gpu requests.
    counted = "0" if binding == "dra" else "8"
    wait_until(
        lambda: (used(crds, namespace) or {}).get(keys.QUOTA_GPU_REQUESTS) == counted,
        what=f"the quota counting {counted} GPUs",
    )

    mpijobs.wait_condition("first", keys.COND_SUCCEEDED, timeout=90)
    wait_until(lambda: mpijobs.decision("second"), timeout=90, what="the second job admitted")
    mpijobs.wait_condition("second", keys.COND_SUCCEEDED, timeout=90)
    admitted = mpijobs.condition("second", keys.COND_GANG_ADMITTED)
    assert admitted is not None
    assert admitted["status"] == "True"


def test_a_device_class_quota_counts_our_claims_and_holds_the_next_job(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """dra binding: the API server charges the operator's claims to the GPU class's quota."""
    make_quota(crds, namespace, {keys.QUOTA_GPU_CLAIM_DEVICES: "8"})
    mpijobs.create(topology_job("first", succeed_after="60s"))
    wait_until(
        lambda: (used(crds, namespace) or {}).get(keys.QUOTA_GPU_CLAIM_DEVICES) == "8",
        what="the first job's claims charged to the quota",
    )
    mpijobs.create(topology_job("second"))
    condition = wait_over_quota(mpijobs, "second")
    assert condition["message"] == (
        f"ResourceQuota gpus in namespace {namespace} allows "
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices: 8; 8 in use (8 counted by the API "
        "server, 0 held by this operator's placements) and this job needs 8"
    )
    mpijobs.delete("first")  # its claims go with it
    wait_until(lambda: mpijobs.decision("second"), timeout=90, what="the second job admitted")
    mpijobs.wait_condition("second", keys.COND_SUCCEEDED, timeout=90)


def test_kubernetes_charges_gpus_only_under_requests(crds: Cluster, namespace: str) -> None:
    """What the operator reads follows what the API server enforces: a quota on
    ``limits.nvidia.com/gpu`` is stored but charges no pod (an extended resource is quota'd only
    under ``requests.``), so it limits nothing in either binding."""
    make_quota(crds, namespace, {"limits.nvidia.com/gpu": "0"})
    crds.core.create_namespaced_pod(namespace, gpu_pod("allowed", 1))  # charged on create
    assert (used(crds, namespace) or {}).get("limits.nvidia.com/gpu") in (None, "0")
    crds.core.delete_namespaced_pod("allowed", namespace, grace_period_seconds=0)
