"""Topology-aware placement on the local cluster of DGX-1 V100 nodes.

Jobs that opt in (``mpijob.io/gpu-topology: "true"``) get, for each worker, a node and a GPU set
on the best NVLink ring, written as pod annotations with a required node affinity; GPUs held by
other jobs' decisions, or requested by pods placed by others, are never handed out twice, also
across a restart.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import keys
from mpijob.placement import allocator, codec
from mpijob.placement.scoring import ring_gbps
from support.gpus import hold
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

TOPOLOGY = {keys.GPU_TOPOLOGY: "true"}


@pytest.fixture(params=["dra", "annotations"])
def operator(start_operator: Any, request: pytest.FixtureRequest) -> Any:
    """Every placement test runs under both GPU bindings: placement decides the same."""
    return start_operator("--gpu-binding", request.param)


def topology_job(name: str, workers: int = 4, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    return mpijob(name, workers=workers, gpus=gpus, annotations=TOPOLOGY, **kw)


def workers(cluster: Cluster, ns: str, job: str, n: int) -> list[Any]:
    def listed() -> list[Any] | None:
        pods = cluster.core.list_namespaced_pod(
            ns, label_selector=f"{keys.LABEL_JOB_NAME}={job},{keys.LABEL_JOB_ROLE}=worker"
        ).items
        return pods if len(pods) == n and all(p.spec.node_name for p in pods) else None

    return wait_until(listed, timeout=60, what=f"{n} bound workers of {job}")


def gpus_of(pods: list[Any]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for p in pods:
        ids = p.metadata.annotations[keys.GPU_IDS]
        out.setdefault(p.spec.node_name, set()).update(int(i) for i in ids.split(","))
    return out


def node_topology(cluster: Cluster, node: str) -> Any:
    return codec.loads(cluster.core.read_node(node).metadata.annotations[keys.GPU_TOPOLOGY])


def test_four_by_one_job_lands_on_one_node_on_an_nvlink_ring(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(topology_job("ring"))
    pods = workers(crds, namespace, "ring", 4)
    placed = gpus_of(pods)
    assert len(placed) == 1, f"spread over nodes: {placed}"
    ((node, gpus),) = placed.items()
    topology = node_topology(crds, node)
    # An NVLink ring: every hop of the best ring order is NVLink, at the node's best 4-ring.
    best = allocator.best_set(topology, frozenset(range(8)), 4)
    assert ring_gbps(topology, tuple(sorted(gpus))) == best.ring_gbps
    assert best.ring_gbps >= 25.0
    for p in pods:
        ann = p.metadata.annotations
        assert float(ann[keys.RING_BANDWIDTH]) == best.ring_gbps
        index = int(ann[keys.GPU_IDS])
        assert ann[keys.GPU_UUIDS] == topology.gpus[index].uuid
        terms = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        expr = terms.node_selector_terms[0].match_expressions[0]
        assert (expr.key, expr.operator, expr.values) == ("kubernetes.io/hostname", "In", [node])
    decision = mpijobs.decision("ring")
    assert decision is not None
    assert decision["spec"]["job"]["uid"] == mpijobs.get("ring")["metadata"]["uid"]
    summary = decision["spec"]["summary"]
    assert node in summary
    admitted = mpijobs.wait_condition("ring", keys.COND_GANG_ADMITTED)
    assert admitted["reason"] == "GangAdmitted"


def test_gpus_of_pods_placed_by_others_count_by_their_requests(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    """Three nodes full and four GPUs of gpu-node-0 held by pods this operator did not place:
    their annotations are not believed (which four is not known), their requests are, so the
    job goes to gpu-node-0's remaining room and nowhere else."""
    for i in range(1, 4):
        hold(crds, namespace, f"gpu-node-{i}", "0,1,2,3,4,5,6,7")
    hold(crds, namespace, "gpu-node-0", "0,3,4,7")
    wait_until(
        lambda: all(
            p.status.phase == "Running" for p in crds.core.list_namespaced_pod(namespace).items
        ),
        what="seed pods Running",
    )
    mpijobs.create(topology_job("free-ring"))
    placed = gpus_of(workers(crds, namespace, "free-ring", 4))
    assert list(placed) == ["gpu-node-0"]
    assert len(placed["gpu-node-0"]) == 4
    mpijobs.create(topology_job("no-room", workers=1, gpus=1))
    wait_until(
        lambda: (
            "held by pods this operator did not place"
            in str((mpijobs.condition("no-room", keys.COND_GANG_ADMITTED) or {}).get("message"))
        ),
        what="the waiting job to name the pods holding GPUs",
    )


def test_two_jobs_submitted_together_never_share_a_gpu(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(topology_job("a", workers=4, gpus=2))
    mpijobs.create(topology_job("b", workers=4, gpus=2))
    a = gpus_of(workers(crds, namespace, "a", 4))
    b = gpus_of(workers(crds, namespace, "b", 4))
    for node in set(a) & set(b):
        assert not a[node] & b[node], f"shared on {node}: {a[node] & b[node]}"
    assert sum(len(g) for g in a.values()) == 8
    assert sum(len(g) for g in b.values()) == 8


def test_after_a_restart_a_new_job_avoids_gpus_in_use(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    first = start_operator()
    mpijobs.create(topology_job("before", workers=3, gpus=8))  # fills three nodes
    before = gpus_of(workers(crds, namespace, "before", 3))
    first.kill(signal.SIGKILL)

    start_operator()
    mpijobs.create(topology_job("after", workers=2, gpus=4))
    after = gpus_of(workers(crds, namespace, "after", 2))
    assert set(after) == {n for n in (f"gpu-node-{i}" for i in range(4)) if n not in before}
    for node, gpus in after.items():
        assert not gpus & before.get(node, set())


def test_placement_honours_the_worker_templates_node_selector_and_affinity(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    job = topology_job("picky", workers=2, gpus=2)
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": ["gpu-node-2", "gpu-node-3"],
                            }
                        ]
                    }
                ]
            }
        }
    }
    worker["nodeSelector"] = {"kubernetes.io/hostname": "gpu-node-3"}
    mpijobs.create(job)
    assert set(gpus_of(workers(crds, namespace, "picky", 2))) == {"gpu-node-3"}


def test_a_job_that_cannot_fit_waits_with_a_message(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(topology_job("huge", workers=1, gpus=16))
    waiting = mpijobs.wait_condition("huge", keys.COND_GANG_ADMITTED, status="False")
    wait_until(
        lambda: "needs 16 GPUs" in mpijobs.condition("huge", keys.COND_GANG_ADMITTED)["message"],
        what="the waiting message",
    )
    assert waiting["reason"] == "GangWaiting"
    assert not crds.core.list_namespaced_pod(namespace).items


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict[str, Any]:
    job = yaml.safe_load((EXAMPLES / name).read_text())
    template = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {})[keys.SIM_SUCCEED_AFTER] = "5s"
    return job


def test_seed_scenarios_topology_aware_against_ordinary_on_two_v100_nodes(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    """The seed's pair (4 workers x 1 GPU on 2 nodes of 8 V100), from examples/.

    The topology-aware job gets one node's best 4-GPU NVLink ring; the ordinary one is placed
    by the scheduler alone and carries no placement; both succeed.
    """
    # Leave two 8-GPU V100 nodes: every other opted-in node (gpu-node-2 and -3, and any node
    # another test or the cluster's owner left) has all its GPUs held.
    opted_in = f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_TOPOLOGY}"
    for other in crds.core.list_node(label_selector=opted_in).items:
        if other.metadata.name not in ("gpu-node-0", "gpu-node-1"):
            count = int((other.status.allocatable or {}).get(keys.GPU_RESOURCE, "0"))
            if count:
                hold(crds, namespace, other.metadata.name, ",".join(map(str, range(count))))
    mpijobs.create(example("pytorch-vgg16-topology.yaml"))
    topo = workers(crds, namespace, "pytorch-vgg16-topology", 4)
    mpijobs.create(example("pytorch-vgg16.yaml"))
    plain = workers(crds, namespace, "pytorch-vgg16", 4)

    placed = gpus_of(topo)
    assert len(placed) == 1
    ((node, gpus),) = placed.items()
    assert node in ("gpu-node-0", "gpu-node-1")
    topology = node_topology(crds, node)
    assert (
        ring_gbps(topology, tuple(sorted(gpus)))
        == allocator.best_set(topology, frozenset(range(8)), 4).ring_gbps
    )
    assert all(keys.GPU_IDS not in (p.metadata.annotations or {}) for p in plain)
    assert {p.spec.node_name for p in plain} <= {"gpu-node-0", "gpu-node-1"}
    mpijobs.wait_condition("pytorch-vgg16-topology", "Succeeded", timeout=90)
    mpijobs.wait_condition("pytorch-vgg16", "Succeeded", timeout=90)


def test_under_the_annotations_binding_an_event_says_the_device_plugin_picks_the_gpus(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    start_operator("--gpu-binding", "annotations")
    mpijobs.create(topology_job("advised", workers=2, gpus=1))
    event = mpijobs.wait_event("advised", keys.REASON_DEVICE_PLUGIN_PICKS)
    assert event["type"] == "Normal"
    assert "the device plugin, not the operator, picks" in event["message"]
    pods = workers(crds, namespace, "advised", 2)
    for p in pods:
        limits = p.spec.containers[0].resources.limits or {}
        assert limits.get(keys.GPU_RESOURCE) == "1", "the pod keeps nvidia.com/gpu"
        assert not p.spec.resource_claims
    assert [e["reason"] for e in mpijobs.events("advised")].count(
        keys.REASON_DEVICE_PLUGIN_PICKS
    ) == 1
