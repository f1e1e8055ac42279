"""The dra GPU binding end to end: the operator pins each placed worker's GPUs with a claim,
the real scheduler allocates exactly those, GPUs held through anyone's claims or kept off by
device taints are avoided, a GPU taken before the binding leads to a new placement, and a SIGKILL
duplicates no claim.

The local cluster runs the simulated NVIDIA DRA driver (hack/dra.py), so ``--gpu-binding=auto``
chooses dra. kwok runs no kubelet: what a worker got is read from its claim's allocation.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from kubernetes import client

from mpijob import keys
from mpijob.desired import claims
from mpijob.gang import quota
from mpijob.placement import allocator, codec
from mpijob.placement.tables import mask_of, tables_for
from support.gpus import hold_by_claim
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

NODE = "gpu-node-0"


def topology_job(name: str, workers: int, gpus: int, node: str | None = None) -> dict[str, Any]:
    """A topology job whose launcher (kwok runs no mpirun) starts once every worker is ready
    and succeeds 3 s later."""
    body = mpijob(
        name,
        workers=workers,
        gpus=gpus,
        annotations={keys.GPU_TOPOLOGY: "true"},
        launcher_annotations={keys.SIM_SUCCEED_AFTER: "3s"},
        spec={"launcherCreationPolicy": keys.LAUNCHER_WAIT_FOR_WORKERS_READY},
    )
    if node:
        template = body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
        template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def topology(cluster: Cluster, node: str) -> Any:
    return codec.loads(cluster.core.read_node(node).metadata.annotations[keys.GPU_TOPOLOGY])


def job_claims(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    found = cluster.resource(keys.DRA_API_VERSION, "ResourceClaim").get(namespace=namespace)
    return [c.to_dict() for c in found.items]


def claim_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    return next((c for c in job_claims(cluster, namespace) if c["metadata"]["name"] == name), None)


def decision_workers(mpijobs: MPIJobs, name: str) -> list[tuple[str, tuple[int, ...]]]:
    decision = wait_until(lambda: mpijobs.decision(name), what=f"{name}'s decision")
    return [(w["node"], tuple(w["gpus"])) for w in decision["spec"]["workers"]]


def allocated_as_decided(
    cluster: Cluster, namespace: str, job: str, places: list[tuple[str, tuple[int, ...]]]
) -> None:
    """Each worker's claim is allocated exactly its decided GPUs, and the pod is on that node."""
    for index, (node, gpus) in enumerate(places):
        pod = f"{job}-worker-{index}"
        got = wait_until(
            lambda pod=pod: claims.allocated_devices(
                claim_of(cluster, namespace, claims.claim_name(pod)) or {}
            ),
            what=f"{pod}'s claim allocated",
        )
        assert sorted(got) == sorted((node, f"gpu-{g}") for g in gpus)
        bound = wait_until(
            lambda pod=pod: (
                (p := cluster.core.read_namespaced_pod(pod, namespace)).spec.node_name and p
            ),
            what=f"{pod} bound",
        )
        assert bound.spec.node_name == node
        assert not any(
            keys.GPU_RESOURCE in ((c.resources.limits or {}) if c.resources else {})
            for c in bound.spec.containers
        ), "the worker asks for its claim, not for nvidia.com/gpu"


def test_each_placed_worker_gets_a_claim_allocated_exactly_its_gpus(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    mpijobs.create(topology_job("pinned", workers=2, gpus=4))
    places = decision_workers(mpijobs, "pinned")
    allocated_as_decided(crds, namespace, "pinned", places)
    owned = job_claims(crds, namespace)
    assert sorted(c["metadata"]["name"] for c in owned) == [
        "pinned-worker-0-gpus",
        "pinned-worker-1-gpus",
    ]
    for c in owned:
        [owner] = c["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == (keys.KIND, "pinned", True)
    mpijobs.wait_condition("pinned", keys.COND_SUCCEEDED, timeout=60)
    mpijobs.delete("pinned")
    wait_until(lambda: not job_claims(crds, namespace), what="the claims collected with the job")
    wait_until(lambda: mpijobs.decision("pinned") is None, what="the decision released")


def test_gpus_held_through_a_foreign_claim_are_avoided_and_the_best_free_ring_taken(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    held = [1, 2]
    hold_by_claim(crds, namespace, "foreign", NODE, held)
    mpijobs.create(topology_job("around", workers=1, gpus=4, node=NODE))
    [(node, gpus)] = decision_workers(mpijobs, "around")
    assert node == NODE
    assert not set(gpus) & set(held)
    tables = tables_for(topology(crds, NODE))
    free = ((1 << 8) - 1) & ~mask_of(held)
    best = allocator.choose(tables, free, 4)
    assert best is not None
    assert tuple(sorted(gpus)) == tuple(sorted(best.gpus))
    allocated_as_decided(crds, namespace, "around", [(node, gpus)])


def test_a_gpu_taken_before_the_binding_leads_to_a_new_placement_and_an_event(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    # A slow client: between the decision and the worker's claim lie several requests.
    op: OperatorProcess = start_operator("--kube-api-qps", "1", "--kube-api-burst", "1")
    mpijobs.create(topology_job("raced", workers=1, gpus=2, node=NODE))
    [(node, first)] = decision_workers(mpijobs, "raced")
    assert op.proc is not None
    op.proc.send_signal(signal.SIGSTOP)  # the operator sleeps between decision and binding
    try:
        hold_by_claim(crds, namespace, "thief", node, list(first))
    finally:
        op.proc.send_signal(signal.SIGCONT)
    event = mpijobs.wait_event("raced", keys.REASON_GPUS_TAKEN, timeout=90)
    assert event["type"] == "Warning"
    assert "placing the job anew" in event["message"]

    def placed_again() -> list[tuple[str, tuple[int, ...]]] | None:
        decision = mpijobs.decision("raced")
        if decision is None:
            return None
        places = [(w["node"], tuple(w["gpus"])) for w in decision["spec"]["workers"]]
        return places if places[0][1] != first else None

    [(node_again, second)] = wait_until(placed_again, timeout=90, what="a new decision")
    assert not set(second) & set(first), "the new placement avoids the taken GPUs"
    allocated_as_decided(crds, namespace, "raced", [(node_again, second)])
    mpijobs.wait_condition("raced", keys.COND_SUCCEEDED, timeout=90)


def test_sigkill_while_claims_are_created_duplicates_none_and_the_job_succeeds(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    first: OperatorProcess = start_operator("--kube-api-qps", "2", "--kube-api-burst", "1")
    mpijobs.create(topology_job("killed", workers=6, gpus=1))
    wait_until(
        lambda: 1 <= len(job_claims(crds, namespace)) < 6,
        timeout=90,
        interval=0.05,
        what="some but not all claims created",
    )
    first.kill(signal.SIGKILL)
    time.sleep(1)
    start_operator()
    mpijobs.wait_condition("killed", keys.COND_SUCCEEDED, timeout=120)
    names = sorted(c["metadata"]["name"] for c in job_claims(crds, namespace))
    assert names == [f"killed-worker-{i}-gpus" for i in range(6)]
    allocated_as_decided(crds, namespace, "killed", decision_workers(mpijobs, "killed"))


def test_gpus_whose_device_taints_keep_claims_off_are_avoided(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """Device taints in the driver's ResourceSlice (beta on 1.36, GA on 1.37): a claim pinned to
    a tainted GPU would never be allocated, so placement leaves tainted GPUs out."""
    slices = crds.resource(keys.DRA_API_VERSION, "ResourceSlice")
    name = f"{NODE}-{keys.NVIDIA_GPU_DRIVER}"
    original = slices.get(name=name).to_dict()["spec"]["devices"]
    tainted = [1, 2]
    devices = [
        {**d, "taints": [{"key": "example.com/ecc", "value": "failing", "effect": "NoSchedule"}]}
        if d["name"] in {f"gpu-{g}" for g in tainted}
        else d
        for d in original
    ]
    merge = "application/merge-patch+json"
    slices.patch(name=name, body={"spec": {"devices": devices}}, content_type=merge)
    try:
        served = slices.get(name=name).to_dict()["spec"]["devices"]
        if not any(d.get("taints") for d in served):
            # 1.35 keeps device taints only with its alpha gate, off here: the field is dropped
            # and no GPU is tainted. From 1.36 on it must be kept.
            version = client.VersionApi(crds.api).get_code()
            assert quota.server_minor({"major": version.major, "minor": version.minor}) == 35
            return
        mpijobs.create(topology_job("untainted", workers=1, gpus=4, node=NODE))
        [(node, gpus)] = decision_workers(mpijobs, "untainted")
        assert node == NODE
        assert not set(gpus) & set(tainted)
        best = allocator.choose(
            tables_for(topology(crds, NODE)), ((1 << 8) - 1) & ~mask_of(tainted), 4
        )
        assert best is not None
        assert tuple(sorted(gpus)) == tuple(sorted(best.gpus))
        allocated_as_decided(crds, namespace, "untainted", [(node, gpus)])
    finally:
        slices.patch(name=name, body={"spec": {"devices": original}}, content_type=merge)
