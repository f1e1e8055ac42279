"""The figure of merit: best ring bottleneck, checked against every ring order."""

from __future__ import annotations

import itertools
import math

import pytest

from mpijob.placement import scoring, topologies
from mpijob.placement.model import Topology

pytestmark = pytest.mark.unit


def every_order_ring(topology: Topology, gpus: tuple[int, ...]) -> float:
    if len(gpus) == 1:
        return math.inf
    first, rest = gpus[0], gpus[1:]
    return max(
        min(topology.gbps(a, b) for a, b in zip(order, (*order[1:], order[0]), strict=True))
        for order in ((first, *perm) for perm in itertools.permutations(rest))
    )


@pytest.mark.parametrize("name", [n for n in topologies.NAMES if topologies.load(n).size <= 8])
def test_ring_is_the_best_order_bottleneck(name: str) -> None:
    topology = topologies.load(name)
    for size in range(1, min(topology.size, 7) + 1):
        for gpus in itertools.combinations(range(topology.size), size):
            assert scoring.ring_gbps(topology, gpus) == every_order_ring(topology, gpus)


def test_ring_order_visits_every_gpu_at_the_ring_bandwidth() -> None:
    topology = topologies.load("dgx1-v100")
    order = scoring.ring_order(topology, {6, 1, 5, 2})
    assert order[0] == 1
    assert sorted(order) == [1, 2, 5, 6]
    hops = zip(order, (*order[1:], order[0]), strict=True)
    assert min(topology.gbps(a, b) for a, b in hops) == 25.0


def test_examples() -> None:
    v100 = topologies.load("dgx1-v100")
    assert scoring.ring_gbps(v100, [3]) == math.inf
    assert scoring.ring_gbps(v100, [0, 3]) == 50.0
    assert scoring.ring_gbps(v100, [0, 5]) == pytest.approx(15.75 * 0.4)
    assert scoring.nvlink_gbps_total(v100, [0, 1, 2, 3]) == 9 * 25.0
    assert scoring.numa_span(v100, [0, 1, 4]) == 2
    with pytest.raises(ValueError, match="at least one GPU"):
        scoring.ring_order(v100, [])
