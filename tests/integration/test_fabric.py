"""Placement over a fabric on the local cluster: simulated GB200 NVL72 racks.

Two racks of 18 simulated GB200 trays (4 GPUs each) carry GFD's clique label and GKE's block and
sub-block labels; the operator runs with ``--fabric nvl72``. The ComputeDomain CRD is a reduced
copy of NVIDIA's DRA driver's (tests/data). The driver's ComputeDomain side is simulated in
part (hack/dra.py): its channel DeviceClass, a ResourceSlice with channel 0 on every tray, and,
played by the test as the driver's controller would, the channel ResourceClaimTemplate of a
ComputeDomain. The controller-manager makes each worker's claim from that template and the
scheduler allocates it on the worker's tray; no IMEX daemon runs.
"""

from __future__ import annotations

import json
import subprocess
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


def _hack() -> tuple[Any, Any]:
    from hack import cluster as local
    from hack import dra

    return local, dra


def tray(name: str) -> dict[str, Any]:
    local, _ = _hack()

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
    _, dra = _hack()
    cluster.apply(dra.channel_class())
    for node in cluster.core.list_node(label_selector=fabric.CLIQUE_LABEL).items:
        cluster.apply(dra.channel_slice(node.metadata.name, node.metadata.uid))
    try:
        yield cluster
    finally:
        cluster.kubectl("delete", "node", *TRAYS, "--ignore-not-found", "--wait=true")
        wait_until(
            lambda: not cluster.core.list_node(label_selector=fabric.CLIQUE_LABEL).items,
            timeout=60,
            what="the simulated GB200 trays gone",
        )


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

    # The driver's controller answers a ComputeDomain with its channel template.
    _, dra = _hack()
    racks.apply(dra.channel_template(cd))

    for pod in wait_until(workers, timeout=60, what="16 workers"):
        claims = {c.name: c.resource_claim_template_name for c in pod.spec.resource_claims}
        assert claims[keys.CHANNEL_CLAIM] == template
        assert {c.name for c in pod.spec.containers[0].resources.claims} == {keys.CHANNEL_CLAIM}

    # Each worker's claim, made from the template, holds its own tray's channel 0.
    placed = {f"train-worker-{i}": w["node"] for i, w in enumerate(decision["spec"]["workers"])}
    claims_api = racks.resource(keys.DRA_API_VERSION, "ResourceClaim")

    def allocated() -> dict[str, tuple[str, str, str, str]] | None:
        out = {}
        for pod in workers() or []:
            statuses = pod.status.resource_claim_statuses or []
            name = next(
                (s.resource_claim_name for s in statuses if s.name == keys.CHANNEL_CLAIM), None
            )
            if not name or not pod.spec.node_name:
                return None
            claim = claims_api.get(name=name, namespace=namespace).to_dict()
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
            (result,) = results.get("results") or [None]
            if result is None:
                return None
            out[pod.metadata.name] = (
                pod.spec.node_name,
                result["driver"],
                result["pool"],
                result["device"],
            )
        return out if len(out) == 16 else None

    got = wait_until(allocated, timeout=90, what="every worker's channel claim allocated")
    channel = (dra.CHANNEL_DRIVER, "channel-0")
    assert got == {pod: (node, channel[0], node, channel[1]) for pod, node in placed.items()}

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


def test_a_level_the_fabric_lacks_makes_the_job_invalid_and_says_which_levels_it_has(
    racks: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(job("odd", 2, **{keys.FABRIC_REQUIRED_LEVEL: "rack"}))
    invalid = mpijobs.wait_condition("odd", keys.COND_INVALID, status="True")
    assert invalid["reason"] == keys.REASON_VALIDATION_ERROR
    assert f"metadata.annotations[{keys.FABRIC_REQUIRED_LEVEL}]" in invalid["message"]
    assert 'supported values: "block", "clique", "leaf", "node"' in invalid["message"]
    event = mpijobs.wait_event("odd", keys.REASON_VALIDATION_ERROR)
    assert event["type"] == "Warning"
    assert 'Unsupported value: "rack"' in event["message"]
    assert mpijobs.decision("odd") is None


HYPERNODE_CRD = "hypernodes.topology.volcano.sh"
#: Levels on Volcano's HyperNode tiers instead of node labels: one tier-1 HyperNode per rack,
#: one tier-2 HyperNode over both.
HYPERNODE_FABRIC = {
    "levels": [
        {"name": "spine", "hyperNodeTier": 2, "gbps": 25},
        {"name": "rack", "hyperNodeTier": 1, "gbps": fabric.NVL72_GBPS},
        {"nodeLabel": "kubernetes.io/hostname"},
    ],
    "outsideGbps": 12.5,
}


def hypernodes() -> list[dict[str, Any]]:
    def hypernode(name: str, tier: int, *members: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": keys.HYPERNODE_API_VERSION,
            "kind": "HyperNode",
            "metadata": {"name": name},
            "spec": {"tier": tier, "members": list(members)},
        }

    racks = [
        hypernode(
            f"rack-{c}", 1, {"type": "Node", "selector": {"regexMatch": {"pattern": f"^gb-{c}-"}}}
        )
        for c in range(len(CLIQUES))
    ]
    spine = hypernode(
        "spine-0",
        2,
        *(
            {"type": "HyperNode", "selector": {"exactMatch": {"name": r["metadata"]["name"]}}}
            for r in racks
        ),
    )
    return [*racks, spine]


def test_hypernodes_are_the_fabric_once_volcanos_crd_appears(
    racks: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs, tmp_path: Any
) -> None:
    racks.kubectl("delete", "crd", HYPERNODE_CRD, "--ignore-not-found", "--wait=true")
    spec = tmp_path / "fabric.json"
    spec.write_text(json.dumps(HYPERNODE_FABRIC))
    start_operator("--fabric", str(spec), "--gpu-binding", "annotations")
    try:
        # Without Volcano's CRD the operator runs: a job naming no level is placed, one that
        # requires a rack waits, naming the HyperNode tier it needs.
        mpijobs.create(job("loose", 2))
        wait_until(lambda: mpijobs.decision("loose"), timeout=60, what="a decision")
        mpijobs.create(job("rack", 16, **{keys.FABRIC_REQUIRED_LEVEL: "rack"}))
        wait_until(
            lambda: (
                "no eligible node is in a tier 1 HyperNode"
                in (mpijobs.condition("rack", keys.COND_GANG_ADMITTED) or {}).get("message", "")
            ),
            timeout=60,
            what="the waiting message naming the tier",
        )

        # Volcano's CRD and the HyperNodes appear: the operator watches them from then on.
        racks.kubectl("apply", "--server-side", "-f", str(ROOT / "tests/data/hypernode-crd.yaml"))
        racks.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{HYPERNODE_CRD}"
        )
        for body in hypernodes():
            racks.apply(body)
        decision = wait_until(lambda: mpijobs.decision("rack"), timeout=90, what="a decision")
        nodes = {w["node"] for w in decision["spec"]["workers"]}
        assert len(nodes) == 16
        assert len({clique_of(n) for n in nodes}) == 1
        assert decision["spec"]["ringGBps"] == fabric.NVL72_GBPS
        assert "in rack rack-" in decision["spec"]["summary"]
    finally:
        racks.kubectl("delete", "crd", HYPERNODE_CRD, "--ignore-not-found", "--wait=true")
        if racks.local:  # Volcano's own CRD back, for its scheduler (hack/volcano.py)
            subprocess.run([sys.executable, "-m", "hack.volcano", "up"], cwd=ROOT, check=True)
