"""Job placement over the fabric: best collective bottleneck, required/preferred levels, ties."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from mpijob.placement import fabric, fabric_baselines, topologies
from mpijob.placement.fabric import Fabric, Level, Location
from mpijob.placement.job import JobRequest, NodeState, NoFit, claim, place_job
from mpijob.placement.span import FabricPlacement, place_on_fabric

pytestmark = pytest.mark.unit

NVL72 = fabric.load("nvl72")


def nvl72_racks(
    racks: int, used: dict[str, set[int]] | None = None
) -> tuple[list[NodeState], dict[str, Location]]:
    """``racks`` NVL72 racks of 18 trays, two racks per leaf, one block."""
    nodes, where = [], {}
    for rack in range(racks):
        for tray in range(18):
            name = f"r{rack}-t{tray:02d}"
            taken = frozenset((used or {}).get(name, ()))
            nodes.append(NodeState(name, topologies.for_node("gb200-tray", name), taken))
            where[name] = ("b0", f"leaf{rack // 2}", f"clique{rack}")
    return nodes, where


def placed(result: FabricPlacement | NoFit) -> FabricPlacement:
    assert isinstance(result, FabricPlacement), result
    return result


def cliques_of(result: FabricPlacement, where: dict[str, Location]) -> set[str]:
    return {where[a.node][2] for a in result.placement.assignments}


def test_sixteen_by_four_lands_in_one_clique_at_nvlink_speed() -> None:
    nodes, where = nvl72_racks(4)
    result = placed(place_on_fabric(JobRequest(16, 4), nodes, NVL72, where))
    assert len(cliques_of(result, where)) == 1
    assert result.level == "clique"
    assert result.ring_gbps == 900.0
    assert len(result.placement.nodes) == 16
    assert all(len(a.gpus) == 4 for a in result.placement.assignments)
    assert result.summary.endswith(f"in clique {result.domain[-1]}")


def test_the_fullest_clique_that_fits_is_chosen_so_empty_racks_stay_whole() -> None:
    # Rack 2 has 16 whole trays free (two taken): a 16x4 job fits it exactly.
    nodes, where = nvl72_racks(4, {"r2-t00": {0}, "r2-t01": {1}})
    result = placed(place_on_fabric(JobRequest(16, 4), nodes, NVL72, where))
    assert cliques_of(result, where) == {"clique2"}


def test_required_clique_across_two_cliques_waits_and_says_why() -> None:
    nodes, where = nvl72_racks(4)
    result = place_on_fabric(JobRequest(20, 4), nodes, NVL72, where, required="clique")
    assert isinstance(result, NoFit)
    assert result.reason == (
        "needs 20x4 GPUs within one clique (nvidia.com/gpu.clique); "
        "most room in one clique: 18 workers (clique3)"
    )


def test_preferred_clique_spans_two_cliques_of_one_leaf_and_says_so() -> None:
    nodes, where = nvl72_racks(4)
    result = placed(place_on_fabric(JobRequest(20, 4), nodes, NVL72, where, preferred="clique"))
    assert not result.preferred_kept
    assert len(cliques_of(result, where)) == 2
    assert result.level == "leaf"
    assert result.ring_gbps == 50.0
    assert "across 2 clique domains" in result.summary
    assert "preferred clique not kept: needs 20x4 GPUs within one clique" in result.summary


def test_preferred_met_is_the_same_as_unconstrained_when_it_fits() -> None:
    nodes, where = nvl72_racks(2)
    free = place_on_fabric(JobRequest(8, 4), nodes, NVL72, where)
    preferred = place_on_fabric(JobRequest(8, 4), nodes, NVL72, where, preferred="clique")
    assert placed(preferred).preferred_kept
    assert placed(free).placement == placed(preferred).placement


def test_a_job_fitting_one_node_stays_on_it_and_required_node_is_honoured() -> None:
    nodes, where = nvl72_racks(1, {f"r0-t{t:02d}": {0} for t in range(18)})
    result = placed(place_on_fabric(JobRequest(3, 1), nodes, NVL72, where, required="node"))
    assert result.level == "node"
    assert len(result.placement.nodes) == 1
    refused = place_on_fabric(JobRequest(4, 1), nodes, NVL72, where, required="node")
    assert isinstance(refused, NoFit)
    assert refused.reason == "needs 4x1 GPUs on one node; most free on one node: 3 GPUs"


def test_not_fitting_at_all_says_what_is_missing() -> None:
    nodes, where = nvl72_racks(1)
    result = place_on_fabric(JobRequest(19, 4), nodes, NVL72, where, required="clique")
    assert isinstance(result, NoFit)
    assert result.reason.startswith("needs 19 workers x 4 GPUs; opted-in nodes have room for 18")


def test_no_node_with_the_label_is_named() -> None:
    nodes, _ = nvl72_racks(1)
    result = place_on_fabric(JobRequest(2, 4), nodes, NVL72, {}, required="clique")
    assert isinstance(result, NoFit)
    assert "no eligible node has the label nvidia.com/gpu.clique" in result.reason


def test_asking_both_levels_or_an_unknown_one_is_a_caller_error() -> None:
    nodes, where = nvl72_racks(1)
    with pytest.raises(ValueError, match="not both"):
        place_on_fabric(JobRequest(2, 4), nodes, NVL72, where, required="clique", preferred="leaf")
    with pytest.raises(ValueError, match="unknown fabric level 'rack'"):
        place_on_fabric(JobRequest(2, 4), nodes, NVL72, where, required="rack")


def test_workers_are_laid_out_domain_by_domain() -> None:
    nodes, where = nvl72_racks(4)
    result = placed(place_on_fabric(JobRequest(40, 4), nodes, NVL72, where))
    order = [where[a.node] for a in result.placement.assignments]
    # Each clique's workers are contiguous in rank order: the ring leaves each domain once.
    changes = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert changes == len(set(order)) - 1
    assert result.level == "block"
    assert result.ring_gbps == 25.0


def test_intra_node_links_decide_between_nodes_of_one_leaf() -> None:
    """DGX-1 V100 nodes in one leaf: a node whose free GPUs form an NVLink ring beats a node
    that has the same count free without one, even though the latter is fuller."""
    v100 = Fabric("one-leaf", (Level("leaf", "leaf", 12.5),), outside_gbps=6.25)
    nodes = [
        # Free {0,1,2,5}: no NVLink ring (5 links only to 1 inside the set).
        NodeState("a", topologies.for_node("dgx1-v100", "a"), frozenset({3, 4, 6, 7})),
        # Free {1,2,5,6}: the ring 1-2-6-5.
        NodeState("b", topologies.for_node("dgx1-v100", "b"), frozenset({0, 3, 4, 7})),
    ]
    where = {"a": ("l0",), "b": ("l0",)}
    result = placed(place_on_fabric(JobRequest(4, 1), nodes, v100, where))
    assert result.placement.nodes == ("b",)
    assert result.ring_gbps == 25.0


def test_flat_fabric_is_never_worse_than_todays_job_placement() -> None:
    rnd = random.Random(7)
    flat = fabric.flat(12.5)
    for _ in range(40):
        nodes = [
            NodeState(
                f"n{i}",
                topologies.for_node(rnd.choice(("dgx1-v100", "pcie-nvlink-bridge")), f"n{i}"),
                frozenset(rnd.sample(range(8), rnd.randint(0, 6))),
            )
            for i in range(5)
        ]
        request = JobRequest(rnd.randint(1, 6), rnd.choice((1, 2)))
        today = place_job(request, nodes)
        ours = place_on_fabric(request, nodes, flat, {})
        assert isinstance(ours, NoFit) == isinstance(today, NoFit)
        if not isinstance(ours, NoFit) and not isinstance(today, NoFit):
            assert ours.ring_gbps >= today.ring_gbps


def _brute_force(
    request: JobRequest, nodes: list[NodeState], fab: Fabric, where: dict[str, Location]
) -> float:
    """Every split of the workers, literally enumerated."""
    rooms = [node.free_count // request.gpus_per_worker for node in nodes]
    best = 0.0
    for counts in itertools.product(*(range(room + 1) for room in rooms)):
        if sum(counts) == request.workers:
            shares = dict(enumerate(counts))
            best = max(best, fabric_baselines.figure(request, nodes, fab, where, shares))
    return best


def _random_cluster(rnd: random.Random, size: int) -> tuple[list[NodeState], dict[str, Location]]:
    kinds = ("dgx1-v100", "dgx-h100", "gb200-tray", "pcie-nvlink-bridge", "rtx8000-4x")
    nodes, where = [], {}
    for i in range(size):
        kind = rnd.choice(kinds)
        topology = topologies.for_node(kind, f"n{i}")
        used = frozenset(rnd.sample(range(topology.size), rnd.randint(0, topology.size - 1)))
        nodes.append(NodeState(f"n{i}", topology, used))
        depth = rnd.choice((0, 1, 2, 3, 3, 3))
        where[f"n{i}"] = (
            f"b{rnd.randint(0, 1)}",
            f"l{rnd.randint(0, 1)}",
            f"c{rnd.randint(0, 1)}",
        )[:depth]
    return nodes, where


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_on_random_small_fabrics(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(25):
        nodes, where = _random_cluster(rnd, rnd.randint(1, 5))
        request = JobRequest(rnd.randint(1, 6), rnd.choice((1, 1, 2, 4)))
        best = _brute_force(request, nodes, NVL72, where)
        result = place_on_fabric(request, nodes, NVL72, where)
        exhaustive = fabric_baselines.exhaustive(request, nodes, NVL72, where)
        bound = fabric_baselines.upper_bound(request, nodes, NVL72, where)
        assert exhaustive == best
        assert bound >= best
        if best == 0.0:
            assert isinstance(result, NoFit)
            continue
        result = placed(result)
        got = math.inf if result.ring_gbps == 0.0 else result.ring_gbps
        assert got == best, (request, result.summary)
        # The reported figure is the split's real one.
        shares: dict[int, int] = {}
        names = [node.name for node in nodes]
        for assignment in result.placement.assignments:
            position = names.index(assignment.node)
            shares[position] = shares.get(position, 0) + 1
        assert fabric_baselines.figure(request, nodes, NVL72, where, shares) == best
        claim(nodes, result.placement)  # no GPU given twice, none outside the free ones


@pytest.mark.parametrize("seed", range(3))
def test_required_level_matches_brute_force_within_one_domain(seed: int) -> None:
    rnd = random.Random(100 + seed)
    for _ in range(25):
        nodes, where = _random_cluster(rnd, rnd.randint(2, 5))
        request = JobRequest(rnd.randint(2, 6), rnd.choice((1, 2, 4)))
        best = fabric_baselines.exhaustive(request, nodes, NVL72, where, min_depth=2)
        result = place_on_fabric(request, nodes, NVL72, where, required="leaf")
        if best == 0.0:
            assert isinstance(result, NoFit)
        else:
            got = placed(result).ring_gbps
            assert (math.inf if got == 0.0 else got) == best


def test_baselines_pick_valid_splits_and_never_beat_the_optimum() -> None:
    rnd = random.Random(11)
    for _ in range(60):
        nodes, where = _random_cluster(rnd, rnd.randint(1, 6))
        request = JobRequest(rnd.randint(1, 6), rnd.choice((1, 2, 4)))
        best = fabric_baselines.exhaustive(request, nodes, NVL72, where)
        for policy in (fabric_baselines.fewest_domains, fabric_baselines.lowest_tier_first):
            shares = policy(request, nodes, NVL72, where)
            if best == 0.0:
                assert shares is None
                continue
            assert shares is not None
            assert sum(shares.values()) == request.workers
            assert all(
                count * request.gpus_per_worker <= nodes[p].free_count
                for p, count in shares.items()
            )
            assert fabric_baselines.figure(request, nodes, NVL72, where, shares) <= best


def test_more_nodes_of_a_kind_than_the_search_can_use_change_nothing() -> None:
    # One leaf of 8-GPU nodes, each with GPUs 0-4 in use (3 free): a 10x3 job needs 10 nodes.
    # The search keeps only the first few nodes of each kind by name; adding 300 more nodes of
    # that kind (later names) and 300 with one GPU free must not move the job; the nodes kept
    # are the first by name.
    def leaf(extra: int) -> tuple[list[NodeState], dict[str, Location]]:
        nodes, where = [], {}
        for i in range(70 + extra):
            name = f"n{i:04d}"
            used = frozenset(range(5)) if i < 70 + extra // 2 else frozenset(range(7))
            nodes.append(NodeState(name, topologies.for_node("dgx-h100", name), used))
            where[name] = ("b0", "leaf0")
        return nodes, where

    rail = fabric.load("hgx-h100-rail")
    small = placed(place_on_fabric(JobRequest(10, 3), *leaf(0)[:1], rail, leaf(0)[1]))
    nodes, where = leaf(600)
    large = placed(place_on_fabric(JobRequest(10, 3), nodes, rail, where))
    assert large.placement == small.placement
    assert small.placement.nodes == tuple(f"n{i:04d}" for i in range(10))
