"""DRA on the local cluster: the real kube-scheduler allocates the GPUs a claim pins by UUID.

The local cluster's simulated NVIDIA DRA driver (hack/dra.py) publishes a ResourceSlice per kwok
node from its topology annotation, and the DeviceClass ``gpu.nvidia.com``. Claims and worker
pods here are built by the operator's own builders (``sync.plan`` with a placement, then
``claims.bind_worker`` in DRA mode) and created by hand: what is tested is that the scheduler
honours them. kwok runs no kubelet, so what a pod got is read from the claim's
``status.allocation``, never from the pod's phase.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired import claims, sync
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.handlers.startup import detect_gpu_binding
from mpijob.placement import codec
from mpijob.platform.kube import Kube
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.wait import wait_until

pytestmark = pytest.mark.integration

NOW = datetime(2024, 5, 1, tzinfo=UTC)


def uuids_of(cluster: Cluster, node: str, gpus: tuple[int, ...]) -> tuple[str, ...]:
    text = cluster.core.read_node(node).metadata.annotations[keys.GPU_TOPOLOGY]
    uuids = codec.loads(text).uuids_of(gpus)
    assert uuids is not None
    return uuids


def bound_workers(
    mpijobs: MPIJobs, cluster: Cluster, name: str, places: list[tuple[str, tuple[int, ...]]]
) -> list[claims.BoundWorker]:
    """A real MPIJob (the owner), its placed workers bound in DRA mode; nothing created yet.

    No operator runs: the job only owns what the test creates, so that deleting it collects them.
    """
    gpus = len(places[0][1])
    created = mpijobs.create(mpijob(name, workers=len(places), gpus=gpus))
    job = api.with_defaults(api.parse(created))
    where = [
        sync.PodPlacement(
            node,
            {
                keys.GPU_IDS: ",".join(map(str, ids)),
                keys.GPU_UUIDS: ",".join(uuids_of(cluster, node, ids)),
            },
        )
        for node, ids in places
    ]
    plan = sync.plan(job, sync.Observed(), NOW, sync.Options(placement=where))
    pods = [
        a.obj
        for a in plan.actions
        if isinstance(a, sync.Create)
        and a.obj["kind"] == "Pod"
        and "-worker-" in a.obj["metadata"]["name"]
    ]
    return [claims.bind_worker(job, pod, GpuBinding.DRA) for pod in pods]


def create(cluster: Cluster, namespace: str, bound: claims.BoundWorker) -> None:
    assert bound.claim is not None, bound.skipped
    cluster.resource(keys.DRA_API_VERSION, "ResourceClaim").create(
        body=bound.claim, namespace=namespace
    )
    cluster.resource("v1", "Pod").create(body=bound.pod, namespace=namespace)


def claim(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    obj = cluster.resource(keys.DRA_API_VERSION, "ResourceClaim").get(
        name=name, namespace=namespace
    )
    return dict(obj.to_dict())


def allocated(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str]]:
    return wait_until(
        lambda: claims.allocated_devices(claim(cluster, namespace, name)),
        timeout=60,
        what=f"claim {name} allocated",
    )


def devices(node: str, gpus: tuple[int, ...]) -> list[tuple[str, str]]:
    """The simulated driver names GPU ``i`` of a node ``gpu-<i>`` in the node's pool."""
    return sorted((node, f"gpu-{i}") for i in gpus)


def test_the_simulated_driver_publishes_each_nodes_gpus(cluster: Cluster) -> None:
    node = "gpu-node-0"
    slices = cluster.resource(keys.DRA_API_VERSION, "ResourceSlice").get(
        field_selector=f"spec.nodeName={node}"
    )
    (only,) = [s.to_dict() for s in slices.items if s.spec.driver == keys.NVIDIA_GPU_DRIVER]
    assert only["spec"]["pool"]["name"] == node
    published = {d["name"]: d["attributes"]["uuid"]["string"] for d in only["spec"]["devices"]}
    assert published == {
        f"gpu-{i}": u for i, u in enumerate(uuids_of(cluster, node, tuple(range(8))))
    }
    device_class = cluster.resource(keys.DRA_API_VERSION, "DeviceClass").get(
        name=keys.NVIDIA_GPU_DRIVER
    )
    assert device_class.metadata.name == keys.NVIDIA_GPU_DRIVER


def test_the_scheduler_allocates_exactly_the_pinned_gpus(
    crds: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    places = [("gpu-node-1", (1, 2, 5, 6)), ("gpu-node-2", (0, 3, 4, 7))]
    bound = bound_workers(mpijobs, crds, "pinned", places)
    for worker in bound:
        create(crds, namespace, worker)
    for worker, (node, gpus) in zip(bound, places, strict=True):
        name = worker.pod["metadata"]["name"]
        claim_name = claims.claim_name(name)
        assert sorted(allocated(crds, namespace, claim_name)) == devices(node, gpus)
        pod = wait_until(
            lambda name=name: (
                (p := crds.core.read_namespaced_pod(name, namespace)).spec.node_name and p
            ),
            timeout=60,
            what=f"{name} bound",
        )
        assert pod.spec.node_name == node
        assert [c.name for c in pod.spec.containers[0].resources.claims] == [claims.POD_CLAIM]
        reserved = claim(crds, namespace, claim_name)["status"]["reservedFor"]
        assert [r["name"] for r in reserved] == [name]
    # Owned by the MPIJob: deleting the job deletes its claims.
    mpijobs.delete("pinned")
    wait_until(
        lambda: (
            not crds.resource(keys.DRA_API_VERSION, "ResourceClaim").get(namespace=namespace).items
        ),
        timeout=60,
        what="the job's claims collected",
    )


def test_a_pinned_gpu_held_by_another_claim_keeps_the_pod_pending(
    crds: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    node = "gpu-node-3"
    (foreign,) = bound_workers(mpijobs, crds, "foreign", [(node, (3,))])
    create(crds, namespace, foreign)
    assert allocated(crds, namespace, claims.claim_name(foreign.pod["metadata"]["name"])) == [
        (node, "gpu-3")
    ]
    (late,) = bound_workers(mpijobs, crds, "late", [(node, (3, 4))])
    create(crds, namespace, late)
    name = late.pod["metadata"]["name"]

    def unschedulable() -> Any:
        pod = crds.core.read_namespaced_pod(name, namespace)
        return next(
            (
                c
                for c in pod.status.conditions or []
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            ),
            None,
        )

    condition = wait_until(unschedulable, timeout=60, what=f"{name} found unschedulable")
    # The scheduler tried and refused: no other GPU was handed out instead of the held one.
    assert claims.allocated_devices(claim(crds, namespace, claims.claim_name(name))) == []
    assert crds.core.read_namespaced_pod(name, namespace).spec.node_name is None
    assert "claim" in condition.message
    # Once the holder is gone, its claim is released and the pinned pair is allocated.
    crds.core.delete_namespaced_pod(
        foreign.pod["metadata"]["name"], namespace, grace_period_seconds=0
    )
    assert sorted(allocated(crds, namespace, claims.claim_name(name))) == devices(node, (3, 4))


async def test_auto_detection_picks_dra_on_this_cluster(cluster: Cluster) -> None:
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig), qps=0, burst=0, concurrency=2)
    try:
        choice = await detect_gpu_binding(kube, "auto")
    finally:
        await kube.aclose()
    assert choice.mode is GpuBinding.DRA
    assert not choice.warning
