"""Admission fits a worker in everything its node advertises, as the scheduler's filter does:
allocatable less what bound pods request, taints and tolerations, not only GPUs."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang import decide, fit, outcome, queue, topology
from mpijob.placement import codec, topologies
from mpijob.placement.job import Placement

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, tzinfo=UTC)
PLACER = decide.Placer(inter_node_gbps=25.0)
ALLOCATABLE = {"cpu": "96", "memory": "768Gi", "pods": "110", keys.GPU_RESOURCE: "8"}


def node(name: str, allocatable: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}]}
    if allocatable is not None:
        status["allocatable"] = allocatable
    return {
        "metadata": {
            "name": name,
            "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY},
            "annotations": {keys.GPU_TOPOLOGY: codec.dumps(topologies.dgx1_v100())},
        },
        "spec": spec,
        "status": status,
    }


def job(
    name: str, gpus: int, *, workers: int = 1, minute: int = 0, requests: Any = None, **pod: Any
) -> Any:
    resources: dict[str, Any] = {"limits": {keys.GPU_RESOURCE: gpus}}
    if requests:
        resources["requests"] = requests
    template = {"spec": {"containers": [{"name": "c", "image": "mpi", "resources": resources}]}}
    template["spec"].update(pod)
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": f"2026-01-01T00:{minute:02d}:00Z",
            "annotations": {keys.GPU_TOPOLOGY: "true"},
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": []}}},
                "Worker": {"replicas": workers, "template": template},
            }
        },
    }
    return api.with_defaults(api.parse(body))


def run(
    jobs: list[Any], nodes: list[dict[str, Any]], requested: dict[str, dict[str, Decimal]] | None
) -> dict[str, queue.Decision[Placement]]:
    snap = topology.Snapshot(nodes, [], {}, requested=requested or {})
    out = decide.decide(
        PLACER,
        snap,
        nodes,
        {},
        jobs,
        priority_values={},
        held_in={},
        where={},
        binding=GpuBinding.ANNOTATIONS,
        now=NOW,
    )
    return {d.job.name: d for d in out.decisions}


def test_a_job_no_node_could_ever_hold_waits_naming_the_resource_and_blocks_no_one() -> None:
    nodes = [node("dgx-0", ALLOCATABLE), node("dgx-1", ALLOCATABLE)]
    huge = job("huge", 8, minute=1, requests={"cpu": "100000"})
    small = job("small", 8, minute=2)
    out = run([huge, small], nodes, {})
    wait = out["huge"]
    assert isinstance(wait, queue.Wait)
    assert wait.unfit
    assert "insufficient cpu (a worker requests 100000" in wait.message
    assert "the most a node has allocatable is 96, on 2 node(s)" in wait.message
    assert isinstance(out["small"], queue.Admit), "it holds no pool: the next job is placed"
    said = outcome.outcome(wait, now=NOW)
    assert said.conditions[0].reason == keys.REASON_NO_NODE_FITS
    assert said.event is not None
    assert said.event.type == "Warning"


def test_an_extended_resource_no_node_advertises_is_named() -> None:
    out = run([job("fpga", 1, requests={"example.com/fpga": "1"})], [node("a", ALLOCATABLE)], {})
    wait = out["fpga"]
    assert isinstance(wait, queue.Wait)
    assert wait.unfit
    assert "insufficient example.com/fpga" in wait.message


def test_the_gpus_of_a_node_whose_cpu_is_taken_are_not_offered() -> None:
    """dgx-0's pods request 90 of its 96 CPUs: one more worker of 20 CPUs fits dgx-1 only."""
    nodes = [node("dgx-0", ALLOCATABLE), node("dgx-1", ALLOCATABLE)]
    busy = {"dgx-0": {"cpu": Decimal(90), "pods": Decimal(3)}}
    out = run([job("j", 4, requests={"cpu": "20"})], nodes, busy)
    admit = out["j"]
    assert isinstance(admit, queue.Admit)
    assert {a.node for a in admit.placement.assignments} == {"dgx-1"}


def test_a_job_that_fits_no_node_now_says_which_resource_is_short() -> None:
    nodes = [node("dgx-0", ALLOCATABLE)]
    busy = {"dgx-0": {"cpu": Decimal(90)}}
    out = run([job("j", 4, requests={"cpu": "20"})], nodes, busy)
    wait = out["j"]
    assert isinstance(wait, queue.Wait)
    assert not wait.unfit, "it would fit an idle node"
    assert "cpu on 1 node(s)" in wait.message


def test_workers_of_one_pass_count_against_the_nodes_they_were_given() -> None:
    """Each worker takes 40 of 96 CPUs: two fit a node, so four workers span two nodes
    although eight GPUs of one node would hold them."""
    nodes = [node("dgx-0", ALLOCATABLE), node("dgx-1", ALLOCATABLE)]
    out = run([job("j", 2, workers=4, requests={"cpu": "40"})], nodes, {})
    admit = out["j"]
    assert isinstance(admit, queue.Admit)
    per_node: dict[str, int] = {}
    for a in admit.placement.assignments:
        per_node[a.node] = per_node.get(a.node, 0) + 1
    assert per_node == {"dgx-0": 2, "dgx-1": 2}


def test_a_tainted_node_takes_only_workers_that_tolerate_it() -> None:
    taint = {"key": "dedicated", "value": "a", "effect": "NoSchedule"}
    nodes = [node("dgx-0", ALLOCATABLE, taints=[taint])]
    out = run([job("plain", 8, minute=1)], nodes, {})
    assert isinstance(out["plain"], queue.Wait)
    assert decide.NO_ELIGIBLE_NODE in out["plain"].message
    tolerant = job(
        "tolerant",
        8,
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "a"}],
    )
    assert isinstance(run([tolerant], nodes, {})["tolerant"], queue.Admit)


def test_a_node_that_advertises_no_allocatable_is_not_judged() -> None:
    out = run([job("j", 8, requests={"cpu": "100000"})], [node("dgx-0")], {})
    assert isinstance(out["j"], queue.Admit)


def test_a_workers_request_is_the_schedulers_without_the_gpus_placement_counts() -> None:
    j = job(
        "j",
        2,
        requests={"cpu": "2", "memory": "1Gi"},
        initContainers=[{"name": "i", "resources": {"requests": {"cpu": "6"}}}],
    )
    assert fit.worker_requests(j) == {
        "cpu": Decimal(6),
        "memory": Decimal(1024**3),
        "pods": Decimal(1),
    }


def test_a_workers_request_is_remembered_per_job_version_only() -> None:
    first = job("v", 2, requests={"cpu": "2"})
    first.metadata.resource_version = "5"
    assert fit.worker_requests(first)["cpu"] == Decimal(2)
    changed = job("v", 2, requests={"cpu": "3"})
    changed.metadata.resource_version = "6"
    assert fit.worker_requests(changed)["cpu"] == Decimal(3), "a new version is read anew"
    unversioned = job("v", 2, requests={"cpu": "4"})
    assert fit.worker_requests(unversioned)["cpu"] == Decimal(4), "none remembered without one"


def test_a_job_too_wide_for_the_nodes_room_even_idle_blocks_no_one() -> None:
    """Eight workers of 40 CPUs: a 96-CPU node holds two, so one node never holds the job; it
    waits without holding the node against the job behind it."""
    nodes = [node("dgx-0", ALLOCATABLE)]
    wide = job("wide", 1, workers=8, minute=1, requests={"cpu": "40"})
    out = run([wide, job("next", 8, minute=2)], nodes, {})
    assert isinstance(out["wide"], queue.Wait)
    assert isinstance(out["next"], queue.Admit)
