"""The table-driven node allocator finds the exhaustive optimum, fast, around used GPUs."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from mpijob.placement import allocator, baselines, scoring, topologies
from mpijob.placement.model import Gpu, PcieLevel, Topology, links_from
from mpijob.placement.tables import mask_of, tables_for

pytestmark = pytest.mark.unit


def fragmentation_states(size: int, *, seed: int, count: int) -> list[frozenset[int]]:
    """All free, one socket's half taken, every other GPU taken, and seeded random states."""
    rnd = random.Random(seed)
    states = [
        frozenset(range(size)),
        frozenset(range(size // 2, size)),
        frozenset(range(0, size, 2)),
        frozenset(range(1, size, 3)),
    ]
    for _ in range(count):
        taken = rnd.randint(1, size - 1)
        states.append(frozenset(range(size)) - frozenset(rnd.sample(range(size), taken)))
    return states


def preference(topology: Topology, gpus: tuple[int, ...]) -> tuple[float, float, int]:
    return (
        scoring.ring_gbps(topology, gpus),
        scoring.nvlink_gbps_total(topology, gpus),
        -scoring.numa_span(topology, gpus),
    )


@pytest.mark.parametrize("name", topologies.NAMES)
def test_allocator_matches_brute_force(name: str) -> None:
    topology = topologies.load(name)
    count = 3 if topology.size > 8 else 24
    for free in fragmentation_states(topology.size, seed=len(name), count=count):
        for size in range(1, len(free) + 1):
            ours = allocator.best_set(topology, free, size)
            optimum = baselines.brute_force(topology, free, size)
            assert ours is not None
            assert optimum is not None
            assert set(ours.gpus) <= free
            assert len(ours.gpus) == size
            assert ours.ring_gbps == optimum.ring_gbps, (sorted(free), size)
            assert ours.ring_gbps == scoring.ring_gbps(topology, ours.gpus)
            assert preference(topology, ours.gpus) == preference(topology, optimum.gpus)


def test_dgx1_v100_six_free_four_wanted_gets_the_nvlink_ring() -> None:
    """BestEffort returns {0,1,2,5} here, which has no NVLink ring; {1,2,5,6} has one."""
    topology = topologies.load("dgx1-v100")
    free = {0, 1, 2, 5, 6, 7}
    choice = allocator.best_set(topology, free, 4)
    assert choice == allocator.Choice((1, 2, 5, 6), 25.0)
    assert baselines.best_effort(topology, sorted(free), 4) == (0, 1, 2, 5)
    assert scoring.ring_gbps(topology, (0, 1, 2, 5)) < 25.0


def test_one_gpu_keeps_the_best_quad_intact() -> None:
    """With {0,1,2,3,4} free, taking 4 leaves the fully linked quad {0,1,2,3}."""
    topology = topologies.load("dgx1-v100")
    choice = allocator.best_set(topology, {0, 1, 2, 3, 4}, 1)
    assert choice is not None
    assert choice.gpus == (4,)
    assert math.isinf(choice.ring_gbps)


def test_two_gpus_prefer_double_nvlink_on_one_socket() -> None:
    topology = topologies.load("dgx1-v100")
    choice = allocator.best_set(topology, range(8), 2)
    assert choice is not None
    a, b = choice.gpus
    assert topology.link(a, b).nvlinks == 2
    assert topology.gpus[a].numa_node == topology.gpus[b].numa_node


def test_used_gpus_are_never_chosen_and_too_few_free_is_none() -> None:
    topology = topologies.load("dgx2")
    free = set(range(16)) - {0, 3, 7, 8, 9, 15}
    for size in range(1, 11):
        choice = allocator.best_set(topology, free, size)
        assert choice is not None
        assert set(choice.gpus) <= free
    assert allocator.best_set(topology, free, 11) is None
    assert allocator.best_set(topology, set(), 1) is None
    with pytest.raises(ValueError, match="at least one GPU"):
        allocator.best_set(topology, free, 0)


def test_free_indices_beyond_the_node_are_ignored() -> None:
    topology = topologies.load("rtx8000-4x")
    assert allocator.best_set(topology, {0, 3, 9}, 2) == allocator.Choice((0, 3), 50.0)


def test_tables_agree_with_reference_scoring_on_every_subset() -> None:
    for name in ("dgx1-v100", "pcie-nvlink-bridge", "rtx8000-4x"):
        topology = topologies.load(name)
        tables = tables_for(topology)
        for size in range(1, topology.size + 1):
            for gpus in itertools.combinations(range(topology.size), size):
                assert tables.ring[mask_of(gpus)] == scoring.ring_gbps(topology, gpus)


def test_cached_and_uncached_decisions_agree() -> None:
    topology = topologies.load("dgx1-p100")
    free = {0, 2, 3, 5, 6, 7}
    first = allocator.best_set(topology, free, 3)
    allocator.clear_cache()
    assert allocator.best_set(topology, free, 3) == first


def sixteen_gpu_pcie_box() -> Topology:
    """A 16-GPU PCIe-only server: pairs under switches, quads under a second level, 2 sockets."""
    levels = {}
    for a, b in itertools.combinations(range(16), 2):
        if a // 2 == b // 2:
            levels[(a, b)] = PcieLevel.PIX
        elif a // 4 == b // 4:
            levels[(a, b)] = PcieLevel.PXB
        elif a // 8 == b // 8:
            levels[(a, b)] = PcieLevel.NODE
        else:
            levels[(a, b)] = PcieLevel.SYS
    gpus = tuple(Gpu(i, numa_node=i // 8) for i in range(16))
    return Topology("pcie-16", gpus, links_from(16, pcie=levels), pcie_gen=4)


def test_allocator_matches_brute_force_on_a_16_gpu_pcie_box() -> None:
    topology = sixteen_gpu_pcie_box()
    rnd = random.Random(16)
    for _ in range(3):
        free = frozenset(rnd.sample(range(16), 11))
        for size in range(1, 12):
            ours = allocator.best_set(topology, free, size)
            optimum = baselines.brute_force(topology, free, size)
            assert ours is not None
            assert optimum is not None
            assert preference(topology, ours.gpus) == preference(topology, optimum.gpus)
