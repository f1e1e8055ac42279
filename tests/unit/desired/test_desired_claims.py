"""Worker pods bound to their chosen GPUs through DRA claims, against golden YAML.

Inputs are tests/data/golden/dra/<job>.mpijob.yaml; each job's workers are placed as PLACEMENTS
says (the same path as the reconcile: ``sync.plan`` with placements), then bound in DRA mode;
the expected claim and pod of every worker are in ``<job>.bound.yaml``. After an intended change,
rewrite them with ``MPIJOB_UPDATE_GOLDEN=1 pytest tests/unit/desired`` and review the diff.
"""

from __future__ import annotations

import copy
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import api, keys
from mpijob.desired import claims, sync
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.placement import topologies
from mpijob.pods.predicates import template_gpus
from support.desired_jobs import make_job

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden" / "dra"
NOW = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
#: Per job: (node, GPU indices) of each worker.
PLACEMENTS = {
    "nccl": [("gpu-node-0", (0, 1, 2, 3)), ("gpu-node-1", (4, 5, 6, 7))],
    "sidecar": [("gpu-node-2", (1, 3, 5, 7))],
}


def placement(node: str, gpus: tuple[int, ...]) -> sync.PodPlacement:
    """What admission decides for one worker: its node, GPU indices and their UUIDs."""
    uuids = topologies.for_node("dgx1-v100", node).uuids_of(gpus)
    assert uuids is not None
    annotations = {
        keys.GPU_IDS: ",".join(map(str, gpus)),
        keys.GPU_UUIDS: ",".join(uuids),
        keys.RING_BANDWIDTH: "25",
    }
    return sync.PodPlacement(node, annotations)


def placed_workers(job: api.MPIJob, where: list[sync.PodPlacement]) -> list[dict[str, Any]]:
    plan = sync.plan(job, sync.Observed(), NOW, sync.Options(placement=where))
    return [
        a.obj
        for a in plan.actions
        if isinstance(a, sync.Create)
        and a.obj["kind"] == "Pod"
        and "-worker-" in a.obj["metadata"]["name"]
    ]


def load(name: str) -> api.MPIJob:
    source = GOLDEN / f"{name}.mpijob.yaml"
    job = api.with_defaults(api.parse(yaml.safe_load(source.read_text())))
    assert api.validate(job) == []
    return job


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_bound_workers_match_golden(name: str) -> None:
    job = load(name)
    where = [placement(node, gpus) for node, gpus in PLACEMENTS[name]]
    bound = [claims.bind_worker(job, pod, GpuBinding.DRA) for pod in placed_workers(job, where)]
    assert all(b.claim is not None and not b.skipped for b in bound)
    documents = [doc for b in bound for doc in (b.claim, b.pod)]
    golden = GOLDEN / f"{name}.bound.yaml"
    if os.environ.get("MPIJOB_UPDATE_GOLDEN"):
        golden.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    assert documents == list(yaml.safe_load_all(golden.read_text()))


def test_every_golden_input_is_placed() -> None:
    assert {p.name.split(".")[0] for p in GOLDEN.glob("*.mpijob.yaml")} == set(PLACEMENTS)


def test_the_claim_pins_exactly_the_chosen_uuids_and_count() -> None:
    job = load("nccl")
    where = placement("gpu-node-1", (4, 5, 6, 7))
    pod = placed_workers(job, [placement("gpu-node-0", (0, 1, 2, 3)), where])[1]
    bound = claims.bind_worker(job, pod, GpuBinding.DRA)
    assert bound.claim is not None
    (request,) = bound.claim["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == "gpu.nvidia.com"
    assert exactly["count"] == 4
    uuids = where.annotations[keys.GPU_UUIDS].split(",")
    assert exactly["selectors"] == [
        {
            "cel": {
                "expression": "device.attributes['gpu.nvidia.com'].uuid in ["
                + ", ".join(f"'{u}'" for u in uuids)
                + "]"
            }
        }
    ]
    assert bound.claim["metadata"]["name"] == "nccl-worker-1-gpus"
    assert bound.claim["metadata"]["ownerReferences"][0]["uid"] == job.metadata.uid
    assert bound.pod["metadata"]["annotations"][keys.GPU_CLAIM] == "nccl-worker-1-gpus"


def test_the_pod_no_longer_asks_the_device_plugin() -> None:
    job = load("nccl")
    pod = placed_workers(job, [placement("gpu-node-0", (0, 1, 2, 3))] * 2)[0]
    bound = claims.bind_worker(job, pod, GpuBinding.DRA)
    resources = bound.pod["spec"]["containers"][0]["resources"]
    assert keys.GPU_RESOURCE not in resources["limits"]
    assert keys.GPU_RESOURCE not in resources["requests"]
    assert resources["limits"] == {"memory": "64Gi"}
    assert resources["claims"] == [{"name": "mpijob-gpus", "request": "gpus"}]
    assert template_gpus(bound.pod) == 0
    # The placement's annotations and node affinity stay: accounting and people read them.
    assert bound.pod["metadata"]["annotations"][keys.GPU_IDS] == "0,1,2,3"
    assert bound.pod["spec"]["affinity"] == pod["spec"]["affinity"]


def test_binding_leaves_the_built_pod_untouched() -> None:
    job = load("sidecar")
    pod = placed_workers(job, [placement("gpu-node-2", (1, 3, 5, 7))])[0]
    before = copy.deepcopy(pod)
    claims.bind_worker(job, pod, GpuBinding.DRA)
    assert pod == before


def test_annotations_mode_changes_nothing() -> None:
    job = load("nccl")
    pod = placed_workers(job, [placement("gpu-node-0", (0, 1, 2, 3))] * 2)[0]
    bound = claims.bind_worker(job, pod, GpuBinding.ANNOTATIONS)
    assert bound == claims.BoundWorker(pod)


def test_a_worker_without_known_uuids_is_left_to_the_device_plugin() -> None:
    job = load("nccl")
    where = sync.PodPlacement("gpu-node-0", {keys.GPU_IDS: "0,1,2,3"})
    pod = placed_workers(job, [where, where])[0]
    bound = claims.bind_worker(job, pod, GpuBinding.DRA)
    assert bound.claim is None
    assert bound.pod is pod
    assert keys.GPU_UUIDS in bound.skipped


def test_a_worker_asking_for_other_than_the_chosen_count_is_not_bound() -> None:
    job = load("nccl")
    pod = placed_workers(job, [placement("gpu-node-0", (0, 1))] * 2)[0]
    bound = claims.bind_worker(job, pod, GpuBinding.DRA)
    assert bound.claim is None
    assert bound.skipped == "its containers ask for 4 GPUs but 2 were chosen"


def test_a_worker_taking_gpus_outside_its_app_containers_is_not_bound() -> None:
    """An init container's GPUs would still be asked of the device plugin beside the claim:
    the pod is left as built, counted as the scheduler counts it."""
    job = load("nccl")
    pod = copy.deepcopy(placed_workers(job, [placement("gpu-node-0", (0, 1, 2, 3))] * 2)[0])
    pod["spec"]["initContainers"] = [
        {"name": "warm", "image": "x", "resources": {"limits": {keys.GPU_RESOURCE: "8"}}}
    ]
    bound = claims.bind_worker(job, pod, GpuBinding.DRA)
    assert bound.claim is None
    assert "it takes 8 GPUs as the scheduler counts them" in bound.skipped


def test_uuids_are_quoted_as_cel_strings() -> None:
    assert claims.uuid_selector(["GPU-a", "x'] || true || ['"]) == (
        "device.attributes['gpu.nvidia.com'].uuid in ['GPU-a', 'x\\'] || true || [\\'']"
    )


def test_a_claim_for_other_devices_has_drifted() -> None:
    job = make_job(
        name="t",
        workers=1,
        worker_template={
            "spec": {"containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
        },
    )
    pod = placed_workers(job, [placement("gpu-node-0", (0, 1))])[0]
    other = placed_workers(job, [placement("gpu-node-0", (2, 3))])[0]
    first = claims.bind_worker(job, pod, GpuBinding.DRA).claim
    again = claims.bind_worker(job, copy.deepcopy(pod), GpuBinding.DRA).claim
    moved = claims.bind_worker(job, other, GpuBinding.DRA).claim
    assert first is not None
    assert again is not None
    assert moved is not None
    live = {**first, "status": {"allocation": {}}}
    assert not claims.claim_drifted(live, again)
    assert claims.claim_drifted(live, moved)


def test_allocated_devices_reads_nvidia_results_only() -> None:
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpus",
                            "driver": "gpu.nvidia.com",
                            "pool": "n1",
                            "device": "gpu-3",
                        },
                        {
                            "request": "nic",
                            "driver": "rdma.example.com",
                            "pool": "n1",
                            "device": "mlx-0",
                        },
                    ]
                }
            }
        }
    }
    assert claims.allocated_devices(claim) == [("n1", "gpu-3")]
    assert claims.allocated_devices({"status": {}}) == []


def test_in_dra_mode_the_plan_creates_each_claim_just_before_its_worker() -> None:
    job = load("nccl")
    where = [placement("gpu-node-0", (0, 1, 2, 3)), placement("gpu-node-1", (4, 5, 6, 7))]
    options = sync.Options(placement=where, gpu_binding=GpuBinding.DRA)
    plan = sync.plan(job, sync.Observed(), NOW, options)
    created = [
        (a.obj["kind"], a.obj["metadata"]["name"])
        for a in plan.actions
        if isinstance(a, sync.Create) and a.obj["kind"] in ("Pod", "ResourceClaim")
    ]
    assert created == [
        ("ResourceClaim", "nccl-worker-0-gpus"),
        ("Pod", "nccl-worker-0"),
        ("ResourceClaim", "nccl-worker-1-gpus"),
        ("Pod", "nccl-worker-1"),
    ]
    # Projected pods are pods only; the launcher is built as ever, without a claim.
    assert [p["kind"] for p in plan.projected.pods] == ["Pod", "Pod"]
    (launcher,) = [
        a.obj for a in plan.actions if isinstance(a, sync.Create) and a.obj["kind"] == "Job"
    ]
    assert "resourceClaims" not in launcher["spec"]["template"]["spec"]


def test_by_default_the_plan_creates_no_claim() -> None:
    job = load("nccl")
    where = [placement("gpu-node-0", (0, 1, 2, 3)), placement("gpu-node-1", (4, 5, 6, 7))]
    plan = sync.plan(job, sync.Observed(), NOW, sync.Options(placement=where))
    kinds = {a.obj["kind"] for a in plan.actions if isinstance(a, sync.Create)}
    assert "ResourceClaim" not in kinds
    pods = placed_workers(job, where)
    assert all(template_gpus(p) == 4 for p in pods)
