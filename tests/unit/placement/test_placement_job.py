"""Whole-job placement: all or nothing, fewest nodes, best ring, used GPUs honoured."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from mpijob.placement import baselines, scoring, topologies
from mpijob.placement.job import (
    JobRequest,
    NodeState,
    NoFit,
    Placement,
    WorkerAssignment,
    claim,
    place_job,
)

pytestmark = pytest.mark.unit

V100 = topologies.load("dgx1-v100")


def node(name: str, used: set[int] | None = None, topology: str = "dgx1-v100") -> NodeState:
    return NodeState(name, topologies.for_node(topology, name), frozenset(used or ()))


def placed(result: Placement | NoFit) -> Placement:
    assert isinstance(result, Placement), result
    return result


def gpus_by_node(placement: Placement) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for assignment in placement.assignments:
        found.setdefault(assignment.node, set()).update(assignment.gpus)
    return found


def test_four_single_gpu_workers_land_on_one_node_on_an_nvlink_ring() -> None:
    nodes = [node("node-0", {3, 4}), node("node-1", {0, 1, 2, 3, 4, 5})]
    placement = placed(place_job(JobRequest(4, 1), nodes))
    assert placement.nodes == ("node-0",)
    assert gpus_by_node(placement) == {"node-0": {1, 2, 5, 6}}
    assert placement.ring_gbps == 25.0
    assert placement.summary == "4x1 GPU on node-0 [1,2,5,6] ring 25.0 GB/s"
    assert all(len(a.gpus) == 1 for a in placement.assignments)


def test_workers_follow_the_ring_so_each_worker_gets_linked_gpus() -> None:
    placement = placed(place_job(JobRequest(2, 2), [node("node-0", {4, 5, 6, 7})]))
    for assignment in placement.assignments:
        a, b = assignment.gpus
        assert V100.link(a, b).nvlinks


def test_best_ring_over_the_union_across_candidate_nodes() -> None:
    # node-a can give 4 GPUs only with a PCIe hop; node-b still has an NVLink ring.
    nodes = [node("node-a", {1, 2, 6, 7}), node("node-b", {0, 3, 4, 7})]
    placement = placed(place_job(JobRequest(1, 4), nodes))
    assert placement.nodes == ("node-b",)
    assert gpus_by_node(placement) == {"node-b": {1, 2, 5, 6}}


def test_equal_rings_prefer_the_fuller_node() -> None:
    nodes = [node("node-a"), node("node-b", {0, 1, 2, 3})]
    assert placed(place_job(JobRequest(4, 1), nodes)).nodes == ("node-b",)


def test_fewest_nodes_before_the_best_ring() -> None:
    # Six GPUs fit only on node-c, whose six include PCIe hops; two nodes would ring faster.
    nodes = [
        node("node-a", {0, 1, 2, 3, 4}),
        node("node-b", {0, 1, 2, 3, 4}),
        node("node-c", {0, 7}),
    ]
    placement = placed(place_job(JobRequest(6, 1), nodes))
    assert placement.nodes == ("node-c",)
    assert placement.ring_gbps == scoring.ring_gbps(V100, range(1, 7))


def test_spread_job_is_bounded_by_the_inter_node_bandwidth() -> None:
    nodes = [node("node-a", {0, 1, 2, 3}), node("node-b", {0, 1, 2, 3})]
    placement = placed(place_job(JobRequest(8, 1), nodes))
    assert gpus_by_node(placement) == {"node-a": {4, 5, 6, 7}, "node-b": {4, 5, 6, 7}}
    assert placement.ring_gbps == 12.5
    assert placement.summary.startswith("8x1 GPU on 2 nodes: node-a [4,5,6,7], node-b [4,5,6,7]")
    fast = placed(place_job(JobRequest(8, 1), nodes, inter_node_gbps=400.0))
    assert fast.ring_gbps == 25.0


def test_all_or_nothing() -> None:
    nodes = [node("node-a", {0, 1, 2, 3, 4, 5}), node("node-b", set(range(1, 8)))]
    result = place_job(JobRequest(4, 1), nodes)
    assert isinstance(result, NoFit)
    assert result.reason == (
        "needs 4 workers x 1 GPUs; opted-in nodes have room for 3 (3 GPUs free on 2 nodes); "
        "largest free NVLink ring: 2"
    )


def test_a_worker_larger_than_any_node_says_so() -> None:
    nodes = [node("node-a", {0, 1, 2, 3}), node("node-b", {0, 1, 2, 3, 4, 7})]
    result = place_job(JobRequest(1, 8), nodes)
    assert result == NoFit(
        "needs 8 GPUs on one opted-in node; most free on one node: 4; largest free NVLink ring: 4"
    )
    two = place_job(JobRequest(2, 5), nodes)
    assert isinstance(two, NoFit)
    assert two.reason.startswith("needs 5 GPUs on one opted-in node for each of 2 workers")


def test_no_nodes() -> None:
    assert place_job(JobRequest(1, 1), []) == NoFit("no opted-in node with a GPU topology")


def test_used_gpus_are_honoured_and_claimed_jobs_never_share() -> None:
    nodes: tuple[NodeState, ...] = (node("node-0", {0, 7}), node("node-1", {2}))
    taken: set[tuple[str, int]] = set()
    for _ in range(6):
        placement = placed(place_job(JobRequest(2, 1), nodes))
        for assignment in placement.assignments:
            for gpu in assignment.gpus:
                assert (assignment.node, gpu) not in taken
                assert gpu not in next(n for n in nodes if n.name == assignment.node).used
                taken.add((assignment.node, gpu))
        nodes = claim(nodes, placement)
    assert len(taken) == 12
    assert isinstance(place_job(JobRequest(2, 1), nodes), NoFit)


def test_claim_refuses_a_gpu_twice() -> None:
    nodes = [node("node-0")]
    placement = placed(place_job(JobRequest(1, 2), nodes))
    with pytest.raises(ValueError, match="already used"):
        claim(claim(nodes, placement), placement)
    ghost = Placement((WorkerAssignment("node-9", (0,)),), 0.0, "")
    with pytest.raises(ValueError, match="unknown nodes"):
        claim(nodes, ghost)


def test_one_gpu_job_has_no_ring_and_uuids_are_known() -> None:
    nodes = [node("node-0", set(range(7)))]
    placement = placed(place_job(JobRequest(1, 1), nodes))
    assert placement.assignments == (WorkerAssignment("node-0", (7,)),)
    assert placement.ring_gbps == 0.0
    assert placement.summary == "1x1 GPU on node-0 [7] no ring"
    uuids = nodes[0].topology.uuids_of(placement.assignments[0].gpus)
    assert uuids is not None
    assert uuids[0].startswith("GPU-")


def test_invalid_requests_and_nodes() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        JobRequest(0, 1)
    with pytest.raises(ValueError, match=r"used GPUs \[8\]"):
        NodeState("n", V100, frozenset({8}))
    with pytest.raises(ValueError, match="unique"):
        place_job(JobRequest(1, 1), [node("n"), node("n")])
    with pytest.raises(ValueError, match="positive"):
        place_job(JobRequest(1, 1), [node("n")], inter_node_gbps=0)


def exhaustive(request: JobRequest, nodes: list[NodeState], inter: float) -> tuple[int, float]:
    """(nodes used, ring) of the best placement, trying every split of workers over nodes."""
    per_worker = request.gpus_per_worker
    rooms = [len(n.topology.gpus) - len(n.used) for n in nodes]
    best: tuple[int, float] | None = None
    for split in itertools.product(*(range(room // per_worker + 1) for room in rooms)):
        if sum(split) != request.workers:
            continue
        used = [i for i, count in enumerate(split) if count]
        rings = []
        for i in used:
            free = set(range(nodes[i].topology.size)) - nodes[i].used
            choice = baselines.brute_force(nodes[i].topology, free, split[i] * per_worker)
            assert choice is not None
            rings.append(choice.ring_gbps)
        ring = min(rings) if len(used) == 1 else min(inter, *rings)
        key = (-len(used), ring)
        if best is None or key > (-best[0], best[1]):
            best = (len(used), ring)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(80))
def test_placement_matches_exhaustive_search_on_small_clusters(seed: int) -> None:
    rnd = random.Random(seed)
    names = ["dgx1-v100", "dgx1-p100", "rtx8000-4x", "pcie-nvlink-bridge", "pcie-8gpu-2socket"]
    nodes = []
    for i in range(rnd.choice([2, 3, 4])):
        topology = topologies.load(rnd.choice(names))
        used = set(rnd.sample(range(topology.size), rnd.randint(0, topology.size - 1)))
        nodes.append(NodeState(f"n{i}", topology, frozenset(used)))
    request = JobRequest(rnd.randint(1, 6), rnd.choice([1, 1, 2, 3]))
    inter = rnd.choice([5.0, 12.5, 30.0])
    result = place_job(request, nodes, inter_node_gbps=inter)
    free = sum(n.free_mask.bit_count() // request.gpus_per_worker for n in nodes)
    if free < request.workers:
        assert isinstance(result, NoFit)
        return
    placement = placed(result)
    count, ring = exhaustive(request, nodes, inter)
    assert len(placement.nodes) == count
    expected = 0.0 if math.isinf(ring) else ring
    assert placement.ring_gbps == expected
    assert len(placement.assignments) == request.workers
    for assignment in placement.assignments:
        state = next(n for n in nodes if n.name == assignment.node)
        assert len(assignment.gpus) == request.gpus_per_worker
        assert not set(assignment.gpus) & state.used
    all_gpus = [(a.node, g) for a in placement.assignments for g in a.gpus]
    assert len(all_gpus) == len(set(all_gpus))
