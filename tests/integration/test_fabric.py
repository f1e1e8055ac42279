"""Placement over a fabric on the local cluster: simulated GB200 NVL72 racks.

Two racks of 18 simulated GB200 trays (4 GPUs each) carry GFD's clique label and GKE's block and
sub-block labels; the operator runs with ``--fabric nvl72``. The ComputeDomain CRD is a reduced
copy of NVIDIA's DRA driver's (tests/data): no driver runs, so workers that claim a channel stay
Pending; what is checked is what the operator decides and creates.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mpijob import keys
from mpijob.placement import fabric
from support.jobs import mpijob
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.wait import wait_until

pytestmark = pytest.mark.integration

CLIQUES = ("7d1c0ffe.0", "7d1c0ffe.1")
TRAYS = [f"gb-{c}-{t:02d}" for c in range(len(CLIQUES)) for t in range(18)]


def tray(name: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "hack"))
    import cluster as local  # hack/cluster.py

    body: dict[str, Any] = local.node_manifest(0, "gb200-tray", 4)
    meta = body["metadata"]
    meta["name"] = name
    meta["labels"].update(
        {
            "kubernetes.io/hostname": name,
            "mpijob.io/gpu-model": "gb200-tray",
            fabric.BLOCK_LABEL: "block-0",
            fabric.SUBBLOCK_LABEL: "leaf-0",
            fabric.CLIQUE_LABEL: CLIQUES[int(name.split("-")[1])],
        }
    )
    meta["annotations"][keys.GPU_TOPOLOGY] = local.topology_annotation("gb200-tray", name)
    return body


@pytest.fixture(scope="module")
def racks(crds: Cluster) -> Iterator[Cluster]:
    cluster = crds
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "tests/data/computedomain-crd.yaml"))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/computedomains.resource.nvidia.com",
    )
    for name in TRAYS:
        cluster.apply(tray(name))

    def ready() -> bool:
        nodes = cluster.core.list_node(label_selector=fabric.CLIQUE_LABEL).items
        up = [
            n
            for n in nodes
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        ]
        return len(up) == len(TRAYS)

    wait_until(ready, timeout=60, what="the simulated GB200 trays Ready")
    try:
        yield cluster
    finally:
        cluster.kubectl("delete", "node", *TRAYS, "--ignore-not-found", "--wait=false")


@pytest.fixture
def operator(start_operator: Any, racks: Cluster) -> Any:
    return start_operator("--fabric", "nvl72", "--gpu-binding", "annotations")


def job(name: str, workers: int, **annotations: str) -> dict[str, Any]:
    return mpijob(
        name, workers=workers, gpus=4, annotations={keys.GPU_TOPOLOGY: "true", **annotations}
    )


def clique_of(node: str) -> str:
    return CLIQUES[int(node.split("-")[1])]


def domains(cluster: Cluster) -> Any:
    return cluster.resource(keys.COMPUTE_DOMAIN_API_VERSION, keys.COMPUTE_DOMAIN_KIND)


def test_sixteen_by_four_lands_in_one_clique_with_a_compute_domain_deleted_with_the_job(
    racks: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(job("train", 16))
    decision = wait_until(lambda: mpijobs.decision("train"), timeout=60, what="a decision")
    nodes = [w["node"] for w in decision["spec"]["workers"]]
    assert len(set(nodes)) == 16
    assert {clique_of(n) for n in nodes} == {CLIQUES[0]}
    assert decision["spec"]["computeDomain"] == "train-compute-domain"
    assert decision["spec"]["ringGBps"] == 900.0

    cd = domains(racks).get(name="train-compute-domain", namespace=namespace).to_dict()
    owner = cd["metadata"]["ownerReferences"][0]
    assert owner["kind"] == keys.KIND
    assert owner["uid"] == mpijobs.get("train")["metadata"]["uid"]
    template = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert template == "train-compute-domain-channel"

    def workers() -> list[Any] | None:
        pods = racks.core.list_namespaced_pod(
            namespace, label_selector=f"{keys.LABEL_JOB_NAME}=train,{keys.LABEL_JOB_ROLE}=worker"
        ).items
        return pods if len(pods) == 16 else None

    for pod in wait_until(workers, timeout=60, what="16 workers"):
        claims = {c.name: c.resource_claim_template_name for c in pod.spec.resource_claims}
        assert claims[keys.CHANNEL_CLAIM] == template
        assert {c.name for c in pod.spec.containers[0].resources.claims} == {keys.CHANNEL_CLAIM}

    mpijobs.delete("train")

    def gone() -> bool:
        names = [d.metadata.name for d in domains(racks).get(namespace=namespace).items]
        return "train-compute-domain" not in names

    wait_until(gone, timeout=60, what="the ComputeDomain collected with its job")


def test_required_clique_across_two_cliques_waits_and_says_why(
    racks: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(job("wide", 20, **{keys.FABRIC_REQUIRED_LEVEL: "clique"}))
    waiting = mpijobs.wait_condition("wide", keys.COND_GANG_ADMITTED, status="False")
    wait_until(
        lambda: (
            "within one clique" in mpijobs.condition("wide", keys.COND_GANG_ADMITTED)["message"]
        ),
        timeout=30,
        what="the waiting message naming the clique",
    )
    message = mpijobs.condition("wide", keys.COND_GANG_ADMITTED)["message"]
    assert waiting["reason"] == keys.REASON_GANG_WAITING
    assert f"needs 20x4 GPUs within one clique ({fabric.CLIQUE_LABEL})" in message
    assert mpijobs.decision("wide") is None


def test_preferred_clique_runs_across_two_and_says_so(
    racks: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(job("wide", 20, **{keys.FABRIC_PREFERRED_LEVEL: "clique"}))
    decision = wait_until(lambda: mpijobs.decision("wide"), timeout=60, what="a decision")
    nodes = [w["node"] for w in decision["spec"]["workers"]]
    assert {clique_of(n) for n in nodes} == set(CLIQUES)
    assert "preferred clique not kept" in decision["spec"]["summary"]
    assert "computeDomain" not in decision["spec"]
    assert decision["spec"]["ringGBps"] == 50.0  # one leaf: a 400 Gb/s NIC per GPU
