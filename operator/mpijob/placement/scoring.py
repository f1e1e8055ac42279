"""The figure of merit of a GPU set, defined directly on the topology graph.

An allreduce ring moves the same volume over every hop, so a ring runs at its slowest hop; a
set is worth its best ring's bottleneck: the largest ``t`` such that the GPUs joined by links of
at least ``t`` GB/s have a Hamiltonian cycle. This module is the reference definition (a
depth-first search per set): the brute-force allocator and the tests use it to check the
table-driven allocator, and job placement uses :func:`ring_order` to lay workers along the ring.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from mpijob.placement.model import Topology


def ring_gbps(topology: Topology, gpus: Collection[int]) -> float:
    """Best ring bottleneck of a set, GB/s per direction; ``inf`` for one GPU (no ring)."""
    order = ring_order(topology, gpus)
    if len(order) == 1:
        return math.inf
    return min(topology.gbps(a, b) for a, b in zip(order, (*order[1:], order[0]), strict=True))


def ring_order(
    topology: Topology, gpus: Collection[int], *, known_gbps: float | None = None
) -> tuple[int, ...]:
    """A ring through the set whose slowest hop is as fast as possible, from its lowest GPU.

    ``known_gbps``, the set's figure of merit when the caller has it, skips faster thresholds.
    """
    members = sorted(set(gpus))
    if not members:
        raise ValueError("a ring needs at least one GPU")
    if len(members) <= 2:
        return tuple(members)
    thresholds = _thresholds(topology, members)
    if known_gbps is not None:
        thresholds = [t for t in thresholds if t <= known_gbps]
    for threshold in thresholds:
        cycle = _hamiltonian_cycle(topology, members, threshold)
        if cycle is not None:
            return cycle
    raise AssertionError("the slowest link always closes a ring")  # pragma: no cover


def nvlink_gbps_total(topology: Topology, gpus: Iterable[int]) -> float:
    """Sum over the set's pairs of their NVLink bandwidth: the first tie-breaker."""
    members = sorted(set(gpus))
    return sum(topology.nvlink_gbps(a, b) for i, a in enumerate(members) for b in members[i + 1 :])


def numa_span(topology: Topology, gpus: Iterable[int]) -> int:
    """How many NUMA nodes the set touches (unknown counts as one): the second tie-breaker."""
    return len({topology.gpus[index].numa_node for index in gpus})


def _thresholds(topology: Topology, members: list[int]) -> list[float]:
    values = {topology.gbps(a, b) for i, a in enumerate(members) for b in members[i + 1 :]}
    return sorted(values, reverse=True)


def _hamiltonian_cycle(
    topology: Topology, members: list[int], threshold: float
) -> tuple[int, ...] | None:
    """A cycle through all members using only links of at least ``threshold``, or None."""
    inside = set(members)
    neighbours = {gpu: _peers(topology, gpu, inside, threshold) for gpu in members}
    if all(len(peers) == len(members) - 1 for peers in neighbours.values()):
        return tuple(members)  # all linked: any order is a ring
    import networkx as nx  # here, not at import: most rings are decided above without it

    # A graph with a cycle through every vertex stays connected after losing any one vertex.
    fast = nx.Graph([(gpu, peer) for gpu, peers in neighbours.items() for peer in peers])
    if len(fast) < len(members) or not nx.is_biconnected(fast):
        return None
    start = members[0]
    path = [start]
    on_path = {start}

    def extend() -> bool:
        if len(path) == len(members):
            return start in neighbours[path[-1]]
        for peer in neighbours[path[-1]]:
            if peer not in on_path:
                path.append(peer)
                on_path.add(peer)
                if extend():
                    return True
                on_path.discard(path.pop())
        return False

    return tuple(path) if extend() else None


def _peers(topology: Topology, gpu: int, inside: set[int], threshold: float) -> list[int]:
    """Members linked to ``gpu`` at ``threshold`` or faster, fastest first."""
    graph = topology.graph
    peers = [
        (-graph.edges[gpu, peer]["gbps"], peer)
        for peer in graph.neighbors(gpu)
        if peer in inside and graph.edges[gpu, peer]["gbps"] >= threshold
    ]
    return [peer for _, peer in sorted(peers)]
